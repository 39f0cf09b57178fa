"""The Debian base images (debian-12, debian-13), built here from Debian packages (mmdebstrap,
the mirror taken from the host's own apt sources), so that the lab works on machines that
reach no image server: a release's recipe (its package list in infra/recipes/debian-<n>, the
files every release shares in infra/recipes/debian, EXTRAS' package lists, the rxe unit and
its udev rule), the cache key that follows every part of it, and the build into a raw disk
with the kernel and initrd beside it for direct boot. A second provision finds the cached
image and builds nothing."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from infra import apt_sources, lab_settings
from infra import run as runner
from infra.config import Extras, Image
from infra.errors import LabError
from infra.image_cache import BaseImage, fresh_build_dir, images_dir, load_manifest, publish
from infra.owned_paths import cache_subdir
from infra.units import rdma_device_files

RECIPES = Path(__file__).resolve().parent / "recipes"
SHARED = "debian"  # the recipe's files every release shares (customize.sh, the initrd, ...)
DEBIAN_DISK_SIZE = "3G"
EXTRAS_DISK_SIZE = {Extras.NONE: DEBIAN_DISK_SIZE, Extras.TORCH: "6G"}  # torch: ~1.3 GB installed


@dataclass(frozen=True)
class Release:
    image: Image
    suite: str  # what mmdebstrap builds

    @property
    def packages_file(self) -> Path:
        return RECIPES / self.image.value / "packages.txt"


RELEASES = {Image.DEBIAN12: Release(Image.DEBIAN12, "bookworm"),
            Image.DEBIAN13: Release(Image.DEBIAN13, "trixie")}
DEBIAN_SUITE = RELEASES[Image.DEBIAN12].suite  # the oldest release's, as before


def release(image: Image = Image.DEBIAN12) -> Release:
    return RELEASES[image]


def cached_debian(extras: Extras = Extras.NONE, image: Image = Image.DEBIAN12) -> BaseImage | None:
    manifest = images_dir() / debian_image_name(extras, image) / "image.json"
    return load_manifest(manifest) if os.path.lexists(manifest) else None


def _package_list(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def extra_packages(extras: Extras) -> list[str]:
    """What EXTRAS adds to either image (Debian's bakes them in, Ubuntu's cloud-init installs)."""
    return [] if extras is Extras.NONE else _package_list(RECIPES / "extras" / f"{extras.value}.txt")


def debian_packages(extras: Extras = Extras.NONE, image: Image = Image.DEBIAN12) -> list[str]:
    return _package_list(release(image).packages_file) + extra_packages(extras)


def debian_image_name(extras: Extras = Extras.NONE, image: Image = Image.DEBIAN12) -> str:
    """The cache directory of a Debian image: the base image keeps its name without extras."""
    key = debian_recipe_key(extras, image)
    return f"{image.value}-{key}" if extras is Extras.NONE else f"{image.value}-{extras.value}-{key}"


def debian_recipe_key(extras: Extras = Extras.NONE, image: Image = Image.DEBIAN12) -> str:
    """Changes whenever anything that goes into the image changes (files, packages, size)."""
    h = hashlib.sha256()
    h.update(f"suite={release(image).suite} size={DEBIAN_DISK_SIZE}\n".encode())
    h.update(" ".join(debian_mmdebstrap_options(Extras.NONE, image)).encode())
    if extras is not Extras.NONE:  # the base image's key stays what it was
        h.update(f"extras={extras.value} size={EXTRAS_DISK_SIZE[extras]} "
                 f"packages={','.join(extra_packages(extras))}\n".encode())
    for path in [*sorted((RECIPES / SHARED).iterdir()), release(image).packages_file]:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for f in rdma_device_files():
        h.update(str(f.path).encode() + b"\0" + f.text.encode() + b"\0")
    return h.hexdigest()[:16]


def debian_mmdebstrap_options(extras: Extras = Extras.NONE, image: Image = Image.DEBIAN12) -> list[str]:
    return [
        "--mode=unshare",  # mounts live in a private namespace: nothing leaks if killed
        "--variant=apt",
        "--skip=essential/unlink",  # else the .deb cache misses the Essential packages
        "--aptopt=APT::Install-Recommends \"false\"",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--include=" + ",".join(debian_packages(extras, image)),
    ]


def ensure_debian(extras: Extras = Extras.NONE, image: Image = Image.DEBIAN12) -> BaseImage:
    dest = images_dir() / debian_image_name(extras, image)
    if (cached := cached_debian(extras, image)) is not None:
        print(f"image: {image.value} found in cache ({dest})", flush=True)
        return cached
    runner.require("mmdebstrap", "mkfs.ext4")
    given = lab_settings.value("RXELAB_APT_SOURCES")
    suite = release(image).suite
    sources_text = apt_sources.image_sources(suite, Path(str(given)) if given else None)
    debs = cache_subdir("debs", make=True)  # root's image is built from what is there
    work = fresh_build_dir(dest.name)
    started = time.monotonic()
    print(f"image: building {image.value} ({len(debian_packages(extras, image))} packages and their "
          f"dependencies) into {dest}", flush=True)
    try:
        sources = work / "debian.sources"  # the host's mirror, for this image's suite
        sources.write_text(sources_text)
        tar = work / "root.tar"
        baked = []  # the rxe unit and its udev rule, copied to their places by the hook
        for f in rdma_device_files():
            (work / f.name).write_text(f.text)
            baked += [shlex.quote(str(work / f.name)), shlex.quote(str(f.path))]
        runner.run_streaming(
            [
                "mmdebstrap",
                *debian_mmdebstrap_options(extras, image),
                '--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
                f"--setup-hook=sync-in {debs} /var/cache/apt/archives/",
                f"--customize-hook=sync-out /var/cache/apt/archives {debs}",
                # a shell command line: the paths quoted (a cache directory may hold spaces)
                f'--customize-hook={shlex.quote(str(RECIPES / SHARED / "customize.sh"))} '
                f'"$1" {" ".join(baked)}',
                suite,
                tar,
                sources,
            ],
            prefix="image: ",
            # a busy host builds for long but keeps moving: stopped only when it stands still
            timeout=lab_settings.CAP_STALLS * lab_settings.stall_window(),
            stall=lab_settings.stall_window(),
            log_file=work / "mmdebstrap.log",
        )
        kernel, initrd = _extract_boot_files(tar, work)
        _tar_to_ext4(tar, work / "disk.raw", work / "root", EXTRAS_DISK_SIZE[extras])
        tar.unlink()
        built = publish(work, dest, BaseImage(image, dest / "disk.raw", "raw",
                                              dest / kernel.name, dest / initrd.name))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    print(f"image: {image.value}{'' if extras is Extras.NONE else ' with ' + extras.value} built in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    return built


def _tar_to_ext4(tar: Path, disk: Path, scratch: Path, size: str = DEBIAN_DISK_SIZE) -> None:
    """Unpack and pack into an ext4 file system; without root, fakeroot keeps the owners."""
    scratch.mkdir()
    script = 'tar -C "$1" --numeric-owner -xpf "$2" && mkfs.ext4 -q -F -L root -d "$1" "$3" "$4"'
    argv = ["sh", "-c", script, "sh", str(scratch), str(tar), str(disk), size]
    if os.geteuid() != 0:
        runner.require("fakeroot")
        argv = ["fakeroot", *argv]
    try:
        stall = lab_settings.stall_window()
        runner.run_streaming(argv, prefix="image: ", timeout=lab_settings.CAP_STALLS * stall,
                             stall=stall, log_file=scratch.parent / "ext4.log")
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
