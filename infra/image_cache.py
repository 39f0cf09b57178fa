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

from infra.config import Image, cache_dir


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


def fresh_build_dir(name: str) -> Path:
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


def publish(work: Path, dest: Path, image: BaseImage) -> BaseImage:
    """A finished build takes its place in the cache at once (a rename), with its description;
    whatever stood there before goes."""
    (work / "image.json").write_text(image.to_json())
    if dest.exists():
        shutil.rmtree(dest)
    work.rename(dest)
    return image
