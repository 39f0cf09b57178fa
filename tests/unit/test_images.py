import hashlib
import http.server
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra import debian_image, images, lab_settings, ubuntu_image
from infra.config import Image
from infra.errors import LabError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RXELAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_recipe_key_is_stable_and_follows_every_recipe_file(tmp_path, monkeypatch):
    before = images.debian_recipe_key()
    assert images.debian_recipe_key() == before
    recipes = tmp_path / "recipes"
    shutil.copytree(images.RECIPES, recipes)
    monkeypatch.setattr(debian_image, "RECIPES", recipes)
    assert images.debian_recipe_key() == before, "same files, same key"
    with (recipes / "debian-12" / "packages.txt").open("a") as f:
        f.write("htop\n")
    assert images.debian_recipe_key() != before
    assert "htop" in images.debian_packages()


def test_packages_list_has_what_the_lab_needs():
    pkgs = images.debian_packages()
    for p in ("rdma-core", "python3-pyverbs", "perftest", "openmpi-bin", "cloud-init"):
        assert p in pkgs


def test_auto_prefers_a_cached_ubuntu_image_and_never_downloads(cache):
    kind, why = images.resolve(Image.AUTO)
    assert kind is Image.DEBIAN13 and "IMAGE=ubuntu-24.04" in why
    d = cache / "images" / "ubuntu-24.04-0123456789abcdef"
    d.mkdir(parents=True)
    (d / images.UBUNTU_FILE).write_bytes(b"disk")
    (d / "image.json").write_text(images.BaseImage(Image.UBUNTU, d / images.UBUNTU_FILE, "qcow2").to_json())
    kind, why = images.resolve(Image.AUTO)
    assert kind is Image.UBUNTU and "in the cache" in why
    assert images.resolve(Image.DEBIAN12)[0] is Image.DEBIAN12


def test_sha256sums_parsing():
    digest = "a" * 64
    text = f"{'b' * 64} *other.img\n{digest} *{images.UBUNTU_FILE}\n"
    assert images.parse_sha256sums(text, images.UBUNTU_FILE) == digest
    with pytest.raises(LabError, match="no entry"):
        images.parse_sha256sums("", images.UBUNTU_FILE)
    with pytest.raises(LabError, match="malformed"):
        images.parse_sha256sums(f"xyz *{images.UBUNTU_FILE}", images.UBUNTU_FILE)


GPG, GPGV = shutil.which("gpg"), shutil.which("gpgv")
NO_GPG = "gpg and gpgv (Debian packages gpg, gpgv) are needed to make and check test signatures"
needs_gpg = pytest.mark.skipif(not (GPG and GPGV), reason=NO_GPG)


class Signer:
    """Throw-away OpenPGP keys in a private GnuPG home (short path: gpg-agent's socket lives
    there), standing in for Ubuntu's cloud image key."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.pinned = self.new_key("test <t@example.invalid>")
        self.other = self.new_key("other <o@example.invalid>")

    def gpg(self, *args: str) -> str:
        assert GPG is not None  # the tests that use it are skipped without it
        argv = [GPG, "--batch", "--homedir", str(self.home), "--passphrase", "",
                "--pinentry-mode", "loopback", *args]
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout

    def new_key(self, uid: str) -> str:
        self.gpg("--quick-gen-key", uid, "ed25519", "sign", "never")
        listing = self.gpg("--with-colons", "--list-keys", uid)
        return next(ln.split(":")[9] for ln in listing.splitlines() if ln.startswith("fpr:"))

    def export(self, keyring: Path, *fingerprints: str) -> Path:
        self.gpg("--yes", "--output", str(keyring), "--export", *fingerprints)
        return keyring

    def sign(self, data: Path, fingerprint: str) -> None:
        self.gpg("--yes", "--local-user", fingerprint, "--output", str(data) + ".gpg",
                 "--detach-sign", str(data))


@pytest.fixture(scope="session")
def signer():
    if not (GPG and GPGV):
        pytest.skip(NO_GPG)
    home = Path(tempfile.mkdtemp(prefix="rxgpg-"))
    home.chmod(0o700)
    try:
        yield Signer(home)
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
                       capture_output=True, timeout=30, check=False)
        shutil.rmtree(home, ignore_errors=True)


@dataclass
class Mirror:
    url: str
    root: Path
    payload: bytes
    signer: Signer
    keyring: Path
    requests: list[str] = field(default_factory=list)

    def publish(self, digest: str | None = None, signed_by: str | None = "pinned") -> None:
        """Write SHA256SUMS (for the payload unless a digest is given) and sign it."""
        sums = self.root / "SHA256SUMS"
        sums.write_text(f"{digest or hashlib.sha256(self.payload).hexdigest()} "
                        f"*{images.UBUNTU_FILE}\n")
        (self.root / "SHA256SUMS.gpg").unlink(missing_ok=True)
        if signed_by:
            self.signer.sign(sums, getattr(self.signer, signed_by))

    def fetched_image(self) -> bool:
        return any(p.lstrip("/") == images.UBUNTU_FILE for p in self.requests)


@pytest.fixture
def image_server(tmp_path, signer, monkeypatch):
    """Serves a fake cloud image, its SHA256SUMS and a signature by a throw-away key from
    127.0.0.1 only; the pinned fingerprint and RXELAB_UBUNTU_KEYRING point at that key (the
    keyring also holds a second key, which is good for signatures but not the pinned one)."""
    root = tmp_path / "www"
    root.mkdir()
    payload = b"not really a disk image\n" * 50000
    (root / images.UBUNTU_FILE).write_bytes(payload)
    keyring = signer.export(tmp_path / "keyring.gpg", signer.pinned, signer.other)
    monkeypatch.setenv("RXELAB_UBUNTU_KEYRING", str(keyring))
    monkeypatch.setattr(ubuntu_image, "UBUNTU_SIGNING_KEY", signer.pinned)
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def send_head(self):
            requests.append(self.path)
            return super().send_head()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    mirror = Mirror(f"http://127.0.0.1:{server.server_address[1]}/", root, payload, signer,
                    keyring, requests)
    mirror.publish()
    try:
        yield mirror
    finally:
        server.shutdown()
        server.server_close()


def nothing_cached(cache: Path) -> bool:
    return images.cached_ubuntu() is None and not list((cache / "images").glob("*"))


@needs_gpg
def test_ubuntu_download_is_verified_and_cached(cache, image_server, capsys):
    image = images.ensure_ubuntu(image_server.url)
    assert image.kind is Image.UBUNTU and image.disk_format == "qcow2"
    assert image.disk.read_bytes() == image_server.payload
    out = capsys.readouterr().out
    assert f"signed by Ubuntu's cloud image key {image_server.signer.pinned}" in out
    assert "downloading" in out
    assert images.ensure_ubuntu("http://127.0.0.1:9/") == image, "second call uses the cache"
    assert images.cached_ubuntu() == image


@needs_gpg
def test_ubuntu_checksum_mismatch_discards_the_download(cache, image_server):
    image_server.publish("0" * 64)  # signed, but the image does not match it
    with pytest.raises(LabError, match="checksum mismatch"):
        images.ensure_ubuntu(image_server.url)
    assert nothing_cached(cache), "nothing half-made is left in the cache"


@needs_gpg
def test_sha256sums_altered_after_signing_is_refused_before_the_download(cache, image_server):
    evil = b"an attacker's image\n" * 1000
    (image_server.root / images.UBUNTU_FILE).write_bytes(evil)
    sums = image_server.root / "SHA256SUMS"
    sums.write_text(f"{hashlib.sha256(evil).hexdigest()} *{images.UBUNTU_FILE}\n")
    with pytest.raises(LabError, match="signature") as e:
        images.ensure_ubuntu(image_server.url)
    assert "BAD signature" in e.value.message, "gpgv's own verdict is quoted"
    assert not image_server.fetched_image()
    assert nothing_cached(cache)


@needs_gpg
def test_a_good_signature_by_another_key_is_refused(cache, image_server):
    image_server.publish(signed_by="other")
    with pytest.raises(LabError, match="signature") as e:
        images.ensure_ubuntu(image_server.url)
    assert image_server.signer.other in e.value.message
    assert image_server.signer.pinned in e.value.message
    assert not image_server.fetched_image()
    assert nothing_cached(cache)


@needs_gpg
def test_a_missing_signature_is_refused(cache, image_server):
    image_server.publish(signed_by=None)
    with pytest.raises(LabError, match=r"cannot fetch the signature .*SHA256SUMS\.gpg.*404") as e:
        images.ensure_ubuntu(image_server.url)
    assert "SHA256SUMS.gpg" in e.value.hint and "IMAGE=debian-12" in e.value.hint
    assert not image_server.fetched_image()
    assert nothing_cached(cache)


@needs_gpg
def test_a_missing_keyring_is_refused_before_anything_is_downloaded(cache, image_server,
                                                                     monkeypatch, tmp_path):
    monkeypatch.setenv("RXELAB_UBUNTU_KEYRING", str(tmp_path / "nowhere.gpg"))
    with pytest.raises(LabError, match="no keyring at .*nowhere.gpg") as e:
        images.ensure_ubuntu(image_server.url)
    assert f"--recv-keys {image_server.signer.pinned}" in e.value.hint
    assert "RXELAB_UBUNTU_KEYRING=" in e.value.hint and "IMAGE=debian-12" in e.value.hint
    assert not image_server.fetched_image()
    assert image_server.requests == [], "not even SHA256SUMS is fetched"
    assert nothing_cached(cache)


def test_the_default_keyring_and_pinned_key_are_ubuntus():
    assert images.UBUNTU_SIGNING_KEY == "D2EB44626FDDC30B513D5BB71A5D6C4C7DB87C81"
    assert lab_settings.BY_NAME["RXELAB_UBUNTU_KEYRING"].default == \
        "/usr/share/keyrings/ubuntu-cloudimage-keyring.gpg"


def test_only_good_signatures_by_unrevoked_unexpired_keys_count():
    fpr, primary = "A" * 40, "B" * 40
    valid = f"[GNUPG:] VALIDSIG {fpr} 2024-01-01 1704067200 0 4 0 22 10 00 {primary}"
    good = f"[GNUPG:] NEWSIG\n[GNUPG:] GOODSIG {fpr[-16:]} test\n{valid}\n"
    assert images.good_signers(good) == [primary], "the primary key's fingerprint, not the subkey's"
    assert images.good_signers(good.replace("GOODSIG", "EXPKEYSIG")) == []
    assert images.good_signers(good.replace("GOODSIG", "REVKEYSIG")) == []
    assert images.good_signers(good + "[GNUPG:] NEWSIG\n[GNUPG:] BADSIG 1234 x\n") == []
    other = f"[GNUPG:] NEWSIG\n[GNUPG:] ERRSIG {'C' * 16} 22 10 00 1704067200 9 -\n"
    assert images.good_signers(other + good) == [primary], "an unknown extra signer is ignored"


@needs_gpg
def test_unreachable_image_server_is_a_clear_error(cache, image_server):
    with pytest.raises(LabError, match="cannot fetch") as e:
        images.ensure_ubuntu("http://127.0.0.1:9/")
    assert "IMAGE=debian-12" in e.value.hint


def test_extras_make_an_image_of_their_own_and_leave_the_base_image_alone(tmp_path, monkeypatch):
    from infra.config import Extras
    base = images.debian_recipe_key()
    torch = images.debian_recipe_key(Extras.TORCH)
    assert torch != base
    assert images.debian_image_name() == f"debian-12-{base}", "the base image keeps its cache"
    assert images.debian_image_name(Extras.TORCH) == f"debian-12-torch-{torch}"
    assert "python3-torch" in images.debian_packages(Extras.TORCH)
    assert "python3-torch" not in images.debian_packages()
    assert "--include=" in " ".join(images.debian_mmdebstrap_options(Extras.TORCH))
    assert "python3-torch" in [o for o in images.debian_mmdebstrap_options(Extras.TORCH)
                               if o.startswith("--include=")][0]
    recipes = tmp_path / "recipes"
    shutil.copytree(images.RECIPES, recipes)
    monkeypatch.setattr(debian_image, "RECIPES", recipes)
    with (recipes / "extras" / "torch.txt").open("a") as f:
        f.write("python3-lz4\n")
    assert images.debian_recipe_key(Extras.TORCH) != torch, "a changed extras list, a new image"
    assert images.debian_recipe_key() == base, "the base image does not depend on extras"


def test_an_image_with_extras_is_found_in_the_cache_under_its_own_name(cache, monkeypatch):
    from infra.config import Extras
    assert images.cached_debian(Extras.TORCH) is None
    d = images.images_dir() / images.debian_image_name(Extras.TORCH)
    d.mkdir(parents=True)
    image = images.BaseImage(images.Image.DEBIAN12, d / "disk.raw", "raw", d / "vmlinuz", d / "initrd")
    (d / "image.json").write_text(image.to_json())
    assert images.cached_debian(Extras.TORCH) == image
    assert images.cached_debian() is None
