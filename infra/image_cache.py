"""The image cache, shared by both base images: what a cached image is (BaseImage, written
beside it as image.json), where images live (~/.cache/rxelab/images, RXELAB_CACHE) and a
build directory of one's own, so that a build killed half way leaves nothing a later
provision would take for an image. infra/debian_image.py and infra/ubuntu_image.py fill it."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from infra.config import Image
from infra.errors import LabError
from infra.owned_paths import CACHE_HINT, cache_subdir, check_chain, check_owned_file, open_private

DISK_FORMATS = ("raw", "qcow2")


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
        """Refused in one line (LabError) unless well formed: its format goes into qemu's
        -drive option and its paths onto qemu's command line, so a format is one qemu knows by
        name and a path is absolute and has no comma (qemu's option separator)."""
        try:
            d = json.loads(text)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            image = cls(
                kind=Image(d["kind"]),
                disk=_path(d["disk"]),
                disk_format=d["disk_format"],
                kernel=_path(d["kernel"]) if d.get("kernel") else None,
                initrd=_path(d["initrd"]) if d.get("initrd") else None,
            )
        except (ValueError, KeyError, TypeError) as err:
            raise LabError(f"an image's description is malformed ({type(err).__name__}: {err})",
                           hint="remove that image's directory from the cache: it is built anew") from None
        if image.disk_format not in DISK_FORMATS:
            raise LabError(f"an image's description names the disk format {image.disk_format!r}, "
                           f"not one of {', '.join(DISK_FORMATS)}",
                           hint="remove that image's directory from the cache: it is built anew")
        return image


def _path(value: object) -> Path:
    if not isinstance(value, str) or not value.startswith("/") or "," in value or "\0" in value:
        raise ValueError(f"{value!r} is not an absolute path without commas")
    return Path(value)


def images_dir() -> Path:
    """The cache's images, checked all the way up (owned_paths): root boots what is there."""
    return cache_subdir("images")


def load_manifest(manifest: Path) -> BaseImage:
    """A cached image as its image.json describes it, taken only if the manifest and the
    files it names are the caller's own (or root's), writable by no one else, and inside the
    image's own directory once resolved: another user's manifest once had root's qemu put an
    overlay on /etc/shadow and boot their kernel."""
    home = manifest.parent
    check_chain(home, hint=CACHE_HINT)
    check_owned_file(manifest, "use it as an image's description", hint=CACHE_HINT)
    try:
        image = BaseImage.from_json(manifest.read_text())
        inside = home.resolve()
    except (OSError, LabError) as err:
        raise LabError(f"{manifest}: {getattr(err, 'message', None) or err}",
                       hint=CACHE_HINT) from None
    for named in (image.disk, image.kernel, image.initrd):
        if named is None:
            continue
        real = named.resolve()
        if real.parent != inside:
            raise LabError(f"{manifest} names {named}, not a file in its image directory {home}: "
                           "refusing to use that image", hint=CACHE_HINT)
        if real.exists():
            check_owned_file(real, "boot it", hint=CACHE_HINT)
    return image


def fresh_build_dir(name: str) -> Path:
    """A build directory of our own; leftovers of killed builds (dead pid) are removed first."""
    base = cache_subdir("images", make=True)
    for old in base.glob(".build-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)
    work = base / f".build-{name}-{os.getpid()}"
    work.mkdir()
    return work


def publish(work: Path, dest: Path, image: BaseImage) -> BaseImage:
    """A finished build takes its place in the cache at once (a rename), with its description;
    whatever stood there before goes."""
    with open_private(work / "image.json") as f:
        f.write(image.to_json())
    os.chmod(work / "image.json", 0o644)
    if dest.exists():
        shutil.rmtree(dest)
    work.rename(dest)
    return image
