"""Base images behind one interface, cached outside the repo and keyed by their recipe: which
image a lab gets (IMAGE=auto takes a cached Ubuntu image, else Debian's, without touching the
network) and the one call that makes sure it exists.

debian-12 and debian-13 are built here from Debian packages (infra/debian_image.py), so they
work on machines that reach no image server. ubuntu-24.04 is the official cloud image, downloaded only when a
user asks for it and trusted only once its signed SHA256SUMS has been checked
(infra/ubuntu_image.py). Both live in the cache (infra/image_cache.py); a second provision
finds the cached image and builds nothing.

The names the rest of the lab and its tests use are importable from here. A constant one of
those modules reads (RECIPES, UBUNTU_SIGNING_KEY) is changed, in a test, in that module.
"""

from __future__ import annotations

from infra.config import Extras, Image
from infra.debian_image import (
    DEBIAN_DISK_SIZE,
    EXTRAS_DISK_SIZE,
    RECIPES,
    RELEASES,
    cached_debian,
    debian_image_name,
    debian_mmdebstrap_options,
    debian_packages,
    debian_recipe_key,
    ensure_debian,
    extra_packages,
)
from infra.errors import LabError
from infra.image_cache import BaseImage, images_dir
from infra.ubuntu_image import (
    UBUNTU_FILE,
    UBUNTU_PACKAGES,
    UBUNTU_SIGNING_KEY,
    cached_ubuntu,
    download,
    ensure_ubuntu,
    good_signers,
    parse_sha256sums,
    ubuntu_keyring,
    verify_ubuntu_signature,
)

__all__ = [
    "DEBIAN_DISK_SIZE", "EXTRAS_DISK_SIZE", "RECIPES", "RELEASES", "UBUNTU_FILE",
    "UBUNTU_PACKAGES", "UBUNTU_SIGNING_KEY", "BaseImage", "Extras", "Image", "cached_debian",
    "cached_ubuntu", "debian_image_name", "debian_mmdebstrap_options", "debian_packages",
    "debian_recipe_key", "download", "ensure", "ensure_debian", "ensure_ubuntu",
    "extra_packages", "good_signers", "images_dir", "parse_sha256sums", "resolve",
    "ubuntu_keyring", "verify_ubuntu_signature",
]


AUTO_DEBIAN = Image.DEBIAN13  # IMAGE=auto's Debian release when no Ubuntu image is cached (issue 54)


def resolve(requested: Image) -> tuple[Image, str]:
    """Pick the image for IMAGE=auto without touching the network; say which and why."""
    if requested is not Image.AUTO:
        return requested, f"image: {requested.value} (asked for)"
    if cached_ubuntu() is not None:
        return Image.UBUNTU, "image: ubuntu-24.04 (IMAGE=auto, its cloud image is in the cache)"
    return AUTO_DEBIAN, (
        f"image: {AUTO_DEBIAN.value}, built from Debian packages (IMAGE=auto and no Ubuntu image "
        "is cached; `make provision IMAGE=ubuntu-24.04` downloads it once, where the network "
        "allows)"
    )


def ensure(kind: Image, extras: Extras = Extras.NONE) -> BaseImage:
    if kind in RELEASES:
        return ensure_debian(extras, kind)
    if kind is Image.UBUNTU:
        return ensure_ubuntu()  # its extras, as its base set, come by cloud-init (infra/nocloud.py)
    raise LabError(f"image {kind.value!r} must be resolved before it is built")
