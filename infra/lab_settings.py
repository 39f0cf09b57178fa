"""Every setting of the testbed, declared once: its default, its range, its meaning.

A user sets them as Make variables or environment variables (`make provision MTU=1500`,
`RXELAB_CACHE=/big/disk make provision`). From this table come the CLI flags and their
defaults (infra/cli.py), LabConfig's defaults and its one check of each value (Setting.check,
called by LabConfig), the experiment specs' MTU range (experiments/spec/__init__.py), the Makefile's
help line (`python -m infra.lab_settings`) and the settings table of docs/lab.md (a test keeps
that page equal to it, and the Makefile's export line complete).

Lab settings (with a `field`) shape a lab: `make provision` writes them once, as the lab's
config file in its state directory, and Terraform is given only that directory and the
file's digest (infra/terraform.py). Host settings (no field) are read where they are used,
through value().
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum

from infra.errors import LabError


class Image(StrEnum):
    AUTO = "auto"
    UBUNTU = "ubuntu-24.04"
    DEBIAN12 = "debian-12"
    DEBIAN13 = "debian-13"


class Extras(StrEnum):
    """Packages baked in beside the base set (infra/recipes/extras/<name>.txt)."""

    NONE = "none"
    TORCH = "torch"


class Accel(StrEnum):
    AUTO = "auto"
    KVM = "kvm"
    TCG = "tcg"


class DataNet(StrEnum):
    """How the isolated data segment is made: a bridge in our own netns (root) or vde_switch."""

    AUTO = "auto"
    BRIDGE = "bridge"
    VDE = "vde"


@dataclass(frozen=True)
class Setting:
    name: str  # the Make / environment variable
    default: str  # as a user would type it; "" = none
    help: str
    field: str = ""  # LabConfig field and Terraform variable; "" for host settings
    kind: type = str  # int, str, or a StrEnum
    low: int | None = None
    high: int | None = None

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    @property
    def choices(self) -> list[str]:
        return [e.value for e in self.kind] if issubclass(self.kind, StrEnum) else []

    def convert(self, text: str | int) -> object:
        """A user-typed value to this setting's type (not yet checked against its range), or
        a LabError that names the setting and says what to use instead."""
        if self.choices:
            try:
                return self.kind(str(text))
            except ValueError:
                raise LabError(f"unknown {self.name} {str(text)!r}",
                               hint=f"use one of {'|'.join(self.choices)}") from None
        if self.kind is int:
            try:
                return int(str(text).strip())
            except ValueError:
                raise LabError(f"{self.name}={text!r} is not a whole number",
                               hint=f"give {self.name} as digits only") from None
        return str(text)

    def check(self, value: object) -> None:
        """The one check of a value of this setting: its type, its choices, its range."""
        if self.choices and value not in self.choices:
            raise LabError(f"unknown {self.name} {value!r}",
                           hint=f"use one of {'|'.join(self.choices)}")
        if self.kind is int:
            if not isinstance(value, int) or isinstance(value, bool):
                raise LabError(f"{self.name}={value!r} is not a whole number",
                               hint=f"give {self.name} as digits only")
            if (self.low is not None and value < self.low) or \
                    (self.high is not None and value > self.high):
                raise LabError(f"{self.name}={value} is out of range",
                               hint=f"use {self.low}..{self.high}")

    def parse(self, text: str | int) -> object:
        """A user-typed value, converted and checked."""
        value = self.convert(text)
        self.check(value)
        return value

    @property
    def default_value(self) -> object:
        """The default, typed (None for a host setting without one)."""
        return self.convert(self.default) if self.default != "" else None

    @property
    def bounds(self) -> tuple[int, int]:
        """A whole-number setting's range, low..high."""
        if self.low is None or self.high is None:
            raise ValueError(f"{self.name} has no range")
        return self.low, self.high

    def from_env(self) -> str:
        return os.environ.get(self.name) or self.default


STATE_DIR = ".lab"  # the lab's state directory, in the repository, unless RXELAB_STATE says

SETTINGS: tuple[Setting, ...] = (
    Setting("NODES", "3", "how many VMs", "nodes", int, 2, 8),
    Setting("IMAGE", "auto", "base image; auto: Ubuntu if its cloud image is cached, else Debian "
            "13; debian-12 and debian-13 are built here from Debian packages", "image", Image),
    Setting("EXTRAS", "none", "packages baked into the image beside the base set: torch adds "
            "Debian's python3-torch (torch.distributed with Gloo, the `gloo` contender; about "
            "1 GB more); part of the image's cache key", "extras", Extras),
    Setting("ACCEL", "auto", "accelerator; auto: KVM only if it really boots the guest",
            "accel", Accel),
    Setting("MEM_MB", "1024", "guest memory per VM, MiB", "mem_mb", int, 384, 16384),
    Setting("DATA_NET", "auto", "data network; auto: bridge as root, else vde",
            "data_net", DataNet),
    Setting("MTU", "9000", "data network MTU (rxe path MTU 4096 at 9000, 1024 at 1500; "
            "vde carries 1500 at most)", "mtu", int, 1280, 9000),
    Setting("LAB", "rxelab", "lab name: names the namespace, taps and MACs, so labs do not clash",
            "lab"),
    Setting("SSH_PORT_BASE", "2220", "node i's SSH is forwarded from 127.0.0.1:(base + i)",
            "ssh_port_base", int, 1024, 65527),
    Setting("RXELAB_STATE", "", f"the lab's state directory (default {STATE_DIR}/)"),
    Setting("RXELAB_CACHE", "", "image and simulator cache (default ~/.cache/rxelab); yours, "
                                "under directories only you or root can write"),
    Setting("RXELAB_STALL", "300", "seconds a long step may go without progress before it is "
            "failed: the image build, a booting node, a node's step of `fab deploy` (progress: "
            "output, a new stage, CPU in use). A slow step that keeps moving is waited for; on a "
            "busy host raise this, not a timeout", kind=int, low=10, high=86400),
    Setting("RXELAB_BOOT_TIMEOUT", "3600", "seconds the whole wait for the nodes to boot may take, "
            "progressing or not", kind=int, low=10, high=86400),
    Setting("RXELAB_UBUNTU_URL", "https://cloud-images.ubuntu.com/releases/noble/release/",
            "where IMAGE=ubuntu-24.04 is downloaded from (a mirror of that folder)"),
    Setting("RXELAB_UBUNTU_KEYRING", "/usr/share/keyrings/ubuntu-cloudimage-keyring.gpg",
            "keyring with Ubuntu's cloud image signing key, which must have signed the "
            "SHA256SUMS of IMAGE=ubuntu-24.04 (Ubuntu's package ubuntu-keyring ships it)"),
    Setting("RXELAB_ACCEPT_NEW_HOST_KEYS", "0", "1: accept and remember the SSH host key of an "
            "inventory host seen for the first time (ssh's accept-new); 0: refuse unknown host keys. "
            "A changed key is always refused", kind=int, low=0, high=1),
    Setting("RXELAB_APT_SOURCES", "", "an apt sources file (deb822 or one-line) naming the Debian "
            "mirror that builds the Debian image (default: the host's own, /etc/apt/sources.list "
            "and sources.list.d/, the first Debian entry)"),
)
BY_NAME = {s.name: s for s in SETTINGS}
STALL = "RXELAB_STALL"
CAP_STALLS = 12  # a step that keeps moving is still stopped after this many stall windows


def stall_window() -> float:
    """RXELAB_STALL, in seconds: how long any long step may stand still."""
    return float(value(STALL))  # type: ignore[arg-type]
LAB_SETTINGS = tuple(s for s in SETTINGS if s.field)
BY_FIELD = {s.field: s for s in LAB_SETTINGS}


def value(name: str) -> object:
    """A host setting's current value (environment or default), parsed; None when unset and
    without a default."""
    setting = BY_NAME[name]
    text = setting.from_env()
    return setting.parse(text) if text != "" else None


def markdown_table() -> str:
    """docs/lab.md's settings table, exactly (a test keeps that page equal to it)."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for s in SETTINGS:
        allowed = ("; " + ", ".join(f"`{c}`" for c in s.choices)) if s.choices else (
            f"; {s.low}..{s.high}" if s.low is not None and s.field else "")
        rows.append(f"| `{s.name}` | {s.default or '-'} | {s.help}{allowed} |")
    return "\n".join(rows)


def make_help() -> str:
    """The lab settings with their defaults, as `make help` shows them."""
    return " ".join(f"{s.name}={s.default}" for s in LAB_SETTINGS)


if __name__ == "__main__":
    print(make_help())
