"""A PATH on which OpenTofu (`tofu`) is the only Terraform, for the tests of the drop-in path.

OpenTofu is on none of the registries our machines reach, so the `tofu` here is a stand-in: it
answers `tofu version` as OpenTofu does ("OpenTofu v...", and `-json` with terraform_version)
and runs everything else with the host's Terraform, logging each call. What it proves: infra
finds and drives `tofu` when no `terraform` is on the PATH. What it cannot: OpenTofu itself.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

VERSION = "1.8.3"


def standin(bin_dir: Path, real: str, version: str = VERSION, log: Path | None = None) -> Path:
    """Write a `tofu` into bin_dir that runs `real` (a Terraform) for everything but `version`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tofu = bin_dir / "tofu"
    record = f'echo "$*" >> {shlex.quote(str(log))}\n' if log else ""
    tofu.write_text(
        "#!/bin/sh\n" + record
        + 'if [ "$1" = version ]; then\n'
        + f'  if [ "$2" = -json ]; then echo \'{{"terraform_version": "{version}"}}\'; '
        + f'else echo "OpenTofu v{version}"; fi\n'
        + "  exit 0\nfi\n"
        + f"exec {shlex.quote(real)} \"$@\"\n")
    tofu.chmod(0o755)
    return tofu


def path_without(name: str, scratch: Path, path: str | None = None) -> str:
    """PATH with every directory that holds `name` replaced by a copy (of links) without it."""
    dirs = []
    for i, d in enumerate((path if path is not None else os.environ.get("PATH", "")).split(os.pathsep)):
        if d and (Path(d) / name).exists():
            shadow = scratch / f"shadow-{i}"
            shadow.mkdir(parents=True, exist_ok=True)
            for entry in Path(d).iterdir():
                if entry.name != name and not (shadow / entry.name).exists():
                    (shadow / entry.name).symlink_to(entry)
            d = str(shadow)
        dirs.append(d)
    return os.pathsep.join(dirs)


def only_tofu_path(scratch: Path, log: Path | None = None) -> str:
    """A PATH where `tofu` (the stand-in over the host's Terraform) is found and `terraform`
    is not."""
    real = shutil.which("terraform")
    if real is None:
        raise RuntimeError("the stand-in needs the host's terraform to run")
    tofu_dir = scratch / "tofu-bin"
    standin(tofu_dir, real, log=log)
    return os.pathsep.join([str(tofu_dir), path_without("terraform", scratch)])
