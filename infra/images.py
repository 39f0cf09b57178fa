"""Base images behind one interface, cached outside the repo and keyed by their recipe.

debian-12 is built here from Debian packages (mmdebstrap, the mirror taken from the host's own
apt sources), so it works on machines that reach no image server. ubuntu-24.04 is the official
cloud image, downloaded only when a user asks for it and checked against the published
SHA256SUMS, which is trusted only once gpgv has found it signed by Ubuntu's cloud image key
(pinned below by fingerprint, looked up in RXELAB_UBUNTU_KEYRING). A second provision finds the
cached image and builds nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from infra import run as runner
from infra import settings
from infra.config import Extras, Image, cache_dir
from infra.errors import LabError
from infra.units import rdma_device_unit

RECIPES = Path(__file__).resolve().parent / "recipes"
DEBIAN_SUITE = "bookworm"
DEBIAN_DISK_SIZE = "3G"
EXTRAS_DISK_SIZE = {Extras.NONE: DEBIAN_DISK_SIZE, Extras.TORCH: "6G"}  # torch: ~1.3 GB installed
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


@dataclass(frozen=True)
class BaseImage:
    """A bootable image: a disk, and for direct kernel boot its kernel and initrd."""

    kind: Image
    disk: Path
    disk_format: str
    kernel: Path | None = None
    initrd: Path | None = None

    @property
    def direct_boot(self) -> bool:
        return self.kernel is not None

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": self.kind.value,
                "disk": str(self.disk),
                "disk_format": self.disk_format,
                "kernel": str(self.kernel) if self.kernel else None,
                "initrd": str(self.initrd) if self.initrd else None,
            },
            indent=2,
        ) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BaseImage:
        d = json.loads(text)
        return cls(
            kind=Image(d["kind"]),
            disk=Path(d["disk"]),
            disk_format=d["disk_format"],
            kernel=Path(d["kernel"]) if d.get("kernel") else None,
            initrd=Path(d["initrd"]) if d.get("initrd") else None,
        )


def images_dir() -> Path:
    return cache_dir() / "images"


# ---- choosing -----------------------------------------------------------------------------
def cached_ubuntu() -> BaseImage | None:
    for manifest in sorted(images_dir().glob("ubuntu-24.04-*/image.json")):
        image = BaseImage.from_json(manifest.read_text())
        if image.disk.exists():
            return image
    return None


def cached_debian(extras: Extras = Extras.NONE) -> BaseImage | None:
    manifest = images_dir() / debian_image_name(extras) / "image.json"
    return BaseImage.from_json(manifest.read_text()) if manifest.exists() else None


def resolve(requested: Image) -> tuple[Image, str]:
    """Pick the image for IMAGE=auto without touching the network; say which and why."""
    if requested is not Image.AUTO:
        return requested, f"image: {requested.value} (asked for)"
    if cached_ubuntu() is not None:
        return Image.UBUNTU, "image: ubuntu-24.04 (IMAGE=auto, its cloud image is in the cache)"
    return Image.DEBIAN, (
        "image: debian-12, built from Debian packages (IMAGE=auto and no Ubuntu image is cached; "
        "`make provision IMAGE=ubuntu-24.04` downloads it once, where the network allows)"
    )


def ensure(kind: Image, extras: Extras = Extras.NONE) -> BaseImage:
    if kind is Image.DEBIAN:
        return ensure_debian(extras)
    if kind is Image.UBUNTU:
        return ensure_ubuntu()  # its extras, as its base set, come by cloud-init (infra/seed.py)
    raise LabError(f"image {kind.value!r} must be resolved before it is built")


# ---- Debian, built locally ----------------------------------------------------------------
def _package_list(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def extra_packages(extras: Extras) -> list[str]:
    """What EXTRAS adds to either image (Debian's bakes them in, Ubuntu's cloud-init installs)."""
    return [] if extras is Extras.NONE else _package_list(RECIPES / "extras" / f"{extras.value}.txt")


def debian_packages(extras: Extras = Extras.NONE) -> list[str]:
    return _package_list(RECIPES / "debian-12" / "packages.txt") + extra_packages(extras)


def debian_image_name(extras: Extras = Extras.NONE) -> str:
    """The cache directory of a Debian image: the base image keeps its name without extras."""
    key = debian_recipe_key(extras)
    return f"debian-12-{key}" if extras is Extras.NONE else f"debian-12-{extras.value}-{key}"


def debian_recipe_key(extras: Extras = Extras.NONE) -> str:
    """Changes whenever anything that goes into the image changes (files, packages, size)."""
    h = hashlib.sha256()
    h.update(f"suite={DEBIAN_SUITE} size={DEBIAN_DISK_SIZE}\n".encode())
    h.update(" ".join(debian_mmdebstrap_options()).encode())
    if extras is not Extras.NONE:  # the base image's key stays what it was
        h.update(f"extras={extras.value} size={EXTRAS_DISK_SIZE[extras]} "
                 f"packages={','.join(extra_packages(extras))}\n".encode())
    for path in sorted((RECIPES / "debian-12").iterdir()):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    name, text = rdma_device_unit()
    h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()[:16]


def debian_mmdebstrap_options(extras: Extras = Extras.NONE) -> list[str]:
    return [
        "--mode=unshare",  # mounts live in a private namespace: nothing leaks if killed
        "--variant=apt",
        "--skip=essential/unlink",  # else the .deb cache misses the Essential packages
        "--aptopt=APT::Install-Recommends \"false\"",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--include=" + ",".join(debian_packages(extras)),
    ]


def ensure_debian(extras: Extras = Extras.NONE) -> BaseImage:
    dest = images_dir() / debian_image_name(extras)
    if (cached := cached_debian(extras)) is not None:
        print(f"image: debian-12 found in cache ({dest})", flush=True)
        return cached
    runner.require("mmdebstrap", "mkfs.ext4")
    sources = Path(str(settings.value("RXELAB_APT_SOURCES")))
    if not sources.exists():
        raise LabError(
            f"no apt sources file at {sources} to take the Debian mirror from",
            hint="set RXELAB_APT_SOURCES to a deb822 .sources file naming a Debian mirror",
        )
    debs = cache_dir() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    work = _fresh_build_dir(dest.name)
    started = time.monotonic()
    print(f"image: building debian-12 ({len(debian_packages(extras))} packages and their dependencies) "
          f"into {dest}", flush=True)
    try:
        tar = work / "root.tar"
        unit_name, unit_text = rdma_device_unit()
        unit = work / unit_name
        unit.write_text(unit_text)
        runner.run_streaming(
            [
                "mmdebstrap",
                *debian_mmdebstrap_options(extras),
                '--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
                f"--setup-hook=sync-in {debs} /var/cache/apt/archives/",
                f"--customize-hook=sync-out /var/cache/apt/archives {debs}",
                # a shell command line: the paths quoted (a cache directory may hold spaces)
                f'--customize-hook={shlex.quote(str(RECIPES / "debian-12" / "customize.sh"))} '
                f'"$1" {shlex.quote(str(unit))}',
                DEBIAN_SUITE,
                tar,
                sources,
            ],
            prefix="image: ",
            timeout=1800,
            log_file=work / "mmdebstrap.log",
        )
        kernel, initrd = _extract_boot_files(tar, work)
        _tar_to_ext4(tar, work / "disk.raw", work / "root", EXTRAS_DISK_SIZE[extras])
        tar.unlink()
        image = BaseImage(Image.DEBIAN, dest / "disk.raw", "raw", dest / kernel.name,
                          dest / initrd.name)
        (work / "image.json").write_text(image.to_json())
        if dest.exists():
            shutil.rmtree(dest)
        work.rename(dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    print(f"image: debian-12{'' if extras is Extras.NONE else ' with ' + extras.value} built in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    return image


def _tar_to_ext4(tar: Path, disk: Path, scratch: Path, size: str = DEBIAN_DISK_SIZE) -> None:
    """Unpack and pack into an ext4 file system; without root, fakeroot keeps the owners."""
    scratch.mkdir()
    script = 'tar -C "$1" --numeric-owner -xpf "$2" && mkfs.ext4 -q -F -L root -d "$1" "$3" "$4"'
    argv = ["sh", "-c", script, "sh", str(scratch), str(tar), str(disk), size]
    if os.geteuid() != 0:
        runner.require("fakeroot")
        argv = ["fakeroot", *argv]
    try:
        runner.run(argv, timeout=900)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _extract_boot_files(tar: Path, into: Path) -> tuple[Path, Path]:
    with tarfile.open(tar) as t:
        names = t.getnames()
        wanted = {}
        for prefix in ("vmlinuz-", "initrd.img-"):
            found = sorted(n for n in names if n.lstrip("./").startswith("boot/" + prefix))
            if not found:
                raise LabError(f"the built root has no /boot/{prefix}*: is linux-image-amd64 in it?")
            wanted[prefix] = found[-1]
        out = []
        for member in wanted.values():
            src = t.extractfile(member)
            assert src is not None
            path = into / Path(member).name
            with path.open("wb") as f:
                shutil.copyfileobj(src, f)
            out.append(path)
    return out[0], out[1]


def _fresh_build_dir(name: str) -> Path:
    """A build directory of our own; leftovers of killed builds (dead pid) are removed first."""
    base = images_dir()
    base.mkdir(parents=True, exist_ok=True)
    for old in base.glob(".build-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)
    work = base / f".build-{name}-{os.getpid()}"
    work.mkdir()
    return work


# ---- Ubuntu, downloaded on request --------------------------------------------------------
def ensure_ubuntu(base_url: str | None = None) -> BaseImage:
    base_url = base_url or str(settings.value("RXELAB_UBUNTU_URL"))
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
    work = _fresh_build_dir(dest.name)
    try:
        disk = work / UBUNTU_FILE
        actual = download(urllib.parse.urljoin(url, UBUNTU_FILE), disk)
        if actual != expected:
            raise LabError(
                f"checksum mismatch for {UBUNTU_FILE}: SHA256SUMS says {expected}, "
                f"the download has {actual}; the file was discarded",
                hint="try again; if it repeats, the mirror or a proxy is serving a bad file",
            )
        image = BaseImage(Image.UBUNTU, dest / UBUNTU_FILE, "qcow2")
        (work / "image.json").write_text(image.to_json())
        if dest.exists():
            shutil.rmtree(dest)
        work.rename(dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return image


def ubuntu_keyring() -> Path:
    """The keyring that holds Ubuntu's cloud image key, and gpgv to use it, or a LabError that
    says how to get them; checked before any download."""
    keyring = Path(str(settings.value("RXELAB_UBUNTU_KEYRING"))).expanduser().resolve()
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
