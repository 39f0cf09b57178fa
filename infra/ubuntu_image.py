"""The ubuntu-24.04 base image: Ubuntu's official cloud image, downloaded only when a user asks
for it and checked against the published SHA256SUMS, which is trusted only once gpgv has found
it signed by Ubuntu's cloud image key (pinned here by fingerprint, looked up in
RXELAB_UBUNTU_KEYRING); nothing half-downloaded or unverified reaches the cache. What the
image lacks, cloud-init installs on first boot (UBUNTU_PACKAGES)."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from infra import lab_settings
from infra import run as runner
from infra.config import Image
from infra.errors import LabError
from infra.image_cache import BaseImage, fresh_build_dir, images_dir, load_manifest, publish

UBUNTU_FILE = "ubuntu-24.04-server-cloudimg-amd64.img"
# "UEC Image Automatic Signing Key <cdimage@ubuntu.com>", which signs the cloud images'
# SHA256SUMS: the primary key fingerprint that SHA256SUMS.gpg must be a good signature by.
UBUNTU_SIGNING_KEY = "D2EB44626FDDC30B513D5BB71A5D6C4C7DB87C81"
# What cloud-init installs on first boot of the Ubuntu image (Debian has them baked in).
UBUNTU_PACKAGES = [
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "rdmacm-utils",
    "perftest",
    "python3-pyverbs",
    "python3-mpi4py",
    "python3-numpy",
    "python3-zstandard",
    "python3-lz4",
    "python3-venv",  # the rxelab wheel goes into a venv that sees the system's pyverbs
    "python3-pip",
    "openmpi-bin",
    # Slurm (slurmctld on the first node, slurmd on each) with MUNGE, and PMIx for srun --mpi=pmix
    "munge",
    "slurmd",
    "slurmctld",
    "slurm-client",
    "slurm-wlm-basic-plugins",
    "libpmix2",
]


def cached_ubuntu() -> BaseImage | None:
    for manifest in sorted(images_dir().glob("ubuntu-24.04-*/image.json")):
        image = load_manifest(manifest)
        if image.disk.exists():
            return image
    return None


def ensure_ubuntu(base_url: str | None = None) -> BaseImage:
    base_url = base_url or str(lab_settings.value("RXELAB_UBUNTU_URL"))
    cached = cached_ubuntu()
    if cached is not None:
        print(f"image: ubuntu-24.04 found in cache ({cached.disk})", flush=True)
        return cached
    keyring = ubuntu_keyring()  # before anything is fetched: without it nothing can be trusted
    url = base_url if base_url.endswith("/") else base_url + "/"
    sums_url = urllib.parse.urljoin(url, "SHA256SUMS")
    sums = _http_get(sums_url)
    signature = _http_get(
        sums_url + ".gpg",
        what="the signature",
        hint="SHA256SUMS is trusted only with Ubuntu's signature SHA256SUMS.gpg beside it: use a "
             "mirror that carries it, or IMAGE=debian-12, which builds from Debian packages")
    verify_ubuntu_signature(sums, signature, keyring)
    expected = parse_sha256sums(sums.decode(errors="replace"), UBUNTU_FILE)
    dest = images_dir() / f"ubuntu-24.04-{expected[:16]}"
    work = fresh_build_dir(dest.name)
    try:
        disk = work / UBUNTU_FILE
        actual = download(urllib.parse.urljoin(url, UBUNTU_FILE), disk)
        if actual != expected:
            raise LabError(
                f"checksum mismatch for {UBUNTU_FILE}: SHA256SUMS says {expected}, "
                f"the download has {actual}; the file was discarded",
                hint="try again; if it repeats, the mirror or a proxy is serving a bad file",
            )
        image = publish(work, dest, BaseImage(Image.UBUNTU, dest / UBUNTU_FILE, "qcow2"))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return image


def ubuntu_keyring() -> Path:
    """The keyring that holds Ubuntu's cloud image key, and gpgv to use it, or a LabError that
    says how to get them; checked before any download."""
    keyring = Path(str(lab_settings.value("RXELAB_UBUNTU_KEYRING"))).expanduser().resolve()
    if not keyring.is_file():
        raise LabError(
            f"no keyring at {keyring} (RXELAB_UBUNTU_KEYRING) to check that the Ubuntu image's "
            f"SHA256SUMS is signed by Ubuntu's cloud image key {UBUNTU_SIGNING_KEY}; "
            "nothing was downloaded",
            hint="Ubuntu hosts have it in package ubuntu-keyring "
                 "(/usr/share/keyrings/ubuntu-cloudimage-keyring.gpg; copy it from one); or fetch "
                 f"the key from a keyserver: gpg --keyserver <keyserver> --recv-keys "
                 f"{UBUNTU_SIGNING_KEY} && gpg --export {UBUNTU_SIGNING_KEY} > "
                 "ubuntu-cloudimage.gpg, then set RXELAB_UBUNTU_KEYRING=/full/path/to/"
                 "ubuntu-cloudimage.gpg. IMAGE=debian-12 needs none of this: it builds from "
                 "Debian packages",
        )
    if shutil.which("gpgv") is None:
        raise LabError(
            "gpgv is not installed; it checks Ubuntu's signature on SHA256SUMS before the image "
            "is downloaded",
            hint="apt-get install gpgv (`make deps` installs it); IMAGE=debian-12 needs no gpgv",
        )
    return keyring


def verify_ubuntu_signature(sums: bytes, signature: bytes, keyring: Path) -> None:
    """SHA256SUMS is trusted only if SHA256SUMS.gpg is a good signature over exactly these bytes
    by the pinned key UBUNTU_SIGNING_KEY; anything else is a LabError."""
    with tempfile.TemporaryDirectory(prefix="rxelab-gpgv-") as tmp:
        data, sig = Path(tmp) / "SHA256SUMS", Path(tmp) / "SHA256SUMS.gpg"
        data.write_bytes(sums)
        sig.write_bytes(signature)
        # --homedir: a fresh empty one, so the user's ~/.gnupg takes no part in the check.
        result = runner.run(
            ["gpgv", "--homedir", tmp, "--status-fd", "1", "--keyring", keyring, sig, data],
            check=False,
            timeout=60,
        )
    pinned = UBUNTU_SIGNING_KEY.upper()
    signers = good_signers(result.stdout)
    if pinned in signers:
        print(f"image: SHA256SUMS is signed by Ubuntu's cloud image key {pinned}", flush=True)
        return
    if signers:
        raise LabError(
            f"SHA256SUMS carries a good signature, but by key {', '.join(signers)}, not by "
            f"Ubuntu's cloud image signing key {pinned}; nothing was downloaded",
            hint=f"the keyring {keyring} (RXELAB_UBUNTU_KEYRING) holds other keys too, and the "
                 "mirror or a proxy serves files that Ubuntu did not sign; IMAGE=debian-12 "
                 "builds from Debian packages instead",
        )
    tail = "\n".join(result.stderr.strip().splitlines()[-6:])
    raise LabError(
        "SHA256SUMS does not carry a good signature by Ubuntu's cloud image signing key "
        f"{pinned} in {keyring}; nothing was downloaded" + (f":\n{tail}" if tail else ""),
        hint="the mirror or a proxy serves a SHA256SUMS that Ubuntu did not sign (or "
             "RXELAB_UBUNTU_KEYRING is not a binary keyring with that key); IMAGE=debian-12 "
             "builds from Debian packages instead",
    )


def good_signers(status: str) -> list[str]:
    """Primary key fingerprints of the signatures that gpgv's --status-fd output reports good
    (GOODSIG, then VALIDSIG whose last field is the primary key's fingerprint). Signatures by an
    expired or revoked key do not count, and one BAD signature anywhere empties the list."""
    signers: list[str] = []
    good = bad = False
    for line in status.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0] != "[GNUPG:]":
            continue
        if parts[1] == "NEWSIG":
            good = False
        elif parts[1] == "GOODSIG":
            good = True
        elif parts[1] == "BADSIG":
            bad = True
        elif parts[1] == "VALIDSIG":
            if good and len(parts) >= 12:
                signers.append(parts[11].upper())
            good = False
    return [] if bad else signers


def parse_sha256sums(text: str, filename: str) -> str:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == filename:
            digest = parts[0].lower()
            if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
                return digest
            raise LabError(f"SHA256SUMS has a malformed entry for {filename}: {parts[0]!r}")
    raise LabError(f"SHA256SUMS has no entry for {filename}")


def _http_get(url: str, *, what: str = "", hint: str | None = None) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return bytes(r.read(1 << 20))
    except (urllib.error.URLError, OSError) as e:
        raise LabError(f"cannot fetch {what + ' ' if what else ''}{url}: {e}",
                       hint=hint or "IMAGE=debian-12 builds an image from Debian packages "
                                    "instead") from None


def download(url: str, dest: Path) -> str:
    """Stream url to dest, printing progress every 10 %; returns the SHA256 of what arrived."""
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as r, dest.open("wb") as f:
            total = int(r.headers.get("Content-Length") or 0)
            done, shown = 0, -10
            while chunk := r.read(1 << 20):
                f.write(chunk)
                h.update(chunk)
                done += len(chunk)
                if total and (pct := done * 100 // total) >= shown + 10:
                    shown = pct - pct % 10
                    print(f"image: downloading {dest.name}: {pct}% of {total >> 20} MiB", flush=True)
    except (urllib.error.URLError, OSError) as e:
        raise LabError(f"download of {url} failed: {e}") from None
    return h.hexdigest()
