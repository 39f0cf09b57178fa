"""The lab's configuration: one frozen value, parsed and validated once, passed explicitly.

Everything that names a node (its MAC addresses, tap, SSH port, data IP) is derived here and
nowhere else, so Terraform, the VM launcher, cloud-init and the inventory cannot disagree.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from infra.errors import LabError

REPO = Path(__file__).resolve().parent.parent
MIN_NODES, MAX_NODES = 2, 8
MIN_MEM_MB, MAX_MEM_MB = 384, 16384
VM_USER = "lab"  # not "rdma": rdma-core owns that group and useradd would fail
RDMA_DEVICE = "rxe0"
RDMA_PORT = 1
GID_INDEX = 1  # the IPv4-mapped RoCEv2 GID; index 0 is the link-local one


class Image(StrEnum):
    AUTO = "auto"
    UBUNTU = "ubuntu-24.04"
    DEBIAN = "debian-12"


class Accel(StrEnum):
    AUTO = "auto"
    KVM = "kvm"
    TCG = "tcg"


class DataNet(StrEnum):
    """How the isolated data segment is made: a bridge in our own netns (root) or vde_switch."""

    AUTO = "auto"
    BRIDGE = "bridge"
    VDE = "vde"


def _choice(enum: type[StrEnum], value: str, what: str) -> StrEnum:
    try:
        return enum(value)
    except ValueError:
        allowed = "|".join(e.value for e in enum)
        raise LabError(f"unknown {what} {value!r}", hint=f"use one of {allowed}") from None


def default_state_dir() -> Path:
    return Path(os.environ.get("RXELAB_STATE") or REPO / ".lab").resolve()


def cache_dir() -> Path:
    base = os.environ.get("RXELAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "rxelab"
    )
    return Path(base).resolve()


@dataclass(frozen=True)
class Node:
    """One VM's identity; index is 1-based."""

    index: int
    name: str
    ssh_port: int
    data_ip: str
    mgmt_mac: str
    data_mac: str
    tap: str


@dataclass(frozen=True)
class LabConfig:
    nodes: int = 3
    image: Image = Image.AUTO
    accel: Accel = Accel.AUTO
    mem_mb: int = 1024
    data_net: DataNet = DataNet.AUTO
    lab: str = "rxelab"
    ssh_port_base: int = 2220
    subnet: str = "10.10.0.0/24"
    state_dir: Path = field(default_factory=default_state_dir)

    def __post_init__(self) -> None:
        if not MIN_NODES <= self.nodes <= MAX_NODES:
            raise LabError(
                f"NODES={self.nodes} is out of range", hint=f"use {MIN_NODES}..{MAX_NODES}"
            )
        if not MIN_MEM_MB <= self.mem_mb <= MAX_MEM_MB:
            raise LabError(
                f"MEM_MB={self.mem_mb} is out of range", hint=f"use {MIN_MEM_MB}..{MAX_MEM_MB}"
            )
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", self.lab):
            raise LabError(
                f"lab name {self.lab!r} is not usable",
                hint="1-8 lower-case letters or digits, starting with a letter",
            )
        if not 1024 <= self.ssh_port_base <= 65535 - MAX_NODES:
            raise LabError(f"SSH port base {self.ssh_port_base} is out of range")
        net = ipaddress.ip_network(self.subnet, strict=True)
        if net.num_addresses < 32:
            raise LabError(f"data subnet {self.subnet} is too small", hint="use a /27 or larger")

    @classmethod
    def from_strings(
        cls,
        *,
        nodes: str | int = 3,
        image: str = "auto",
        accel: str = "auto",
        mem_mb: str | int = 1024,
        data_net: str = "auto",
        **rest: object,
    ) -> LabConfig:
        """Build from user-typed values (Make variables, CLI flags) with clear errors."""

        def integer(value: str | int, what: str) -> int:
            try:
                return int(value)
            except (TypeError, ValueError):
                raise LabError(f"{what}={value!r} is not a whole number",
                               hint=f"give {what} as digits only") from None

        return cls(
            nodes=integer(nodes, "NODES"),
            image=Image(_choice(Image, image, "IMAGE")),
            accel=Accel(_choice(Accel, accel, "ACCEL")),
            mem_mb=integer(mem_mb, "MEM_MB"),
            data_net=DataNet(_choice(DataNet, data_net, "DATA_NET")),
            **rest,  # type: ignore[arg-type]
        )

    # ---- derived names -------------------------------------------------------------
    @property
    def netns(self) -> str:
        return f"{self.lab}-data"

    @property
    def bridge(self) -> str:
        return "br0"  # lives inside our own netns, so it cannot clash with the host's

    def node(self, index: int) -> Node:
        if not 1 <= index <= self.nodes:
            raise LabError(f"node index {index} is outside 1..{self.nodes}")
        net = ipaddress.ip_network(self.subnet)
        return Node(
            index=index,
            name=f"node{index}",
            ssh_port=self.ssh_port_base + index,
            data_ip=str(net.network_address + 10 + index),
            mgmt_mac=f"52:54:00:{_lab_byte(self.lab):02x}:00:{index:02x}",
            data_mac=f"52:54:00:{_lab_byte(self.lab):02x}:01:{index:02x}",
            tap=f"{self.lab}t{index}",
        )

    def all_nodes(self) -> list[Node]:
        return [self.node(i) for i in range(1, self.nodes + 1)]

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    # ---- persistence ----------------------------------------------------------------
    def to_json(self) -> str:
        data = asdict(self)
        data["state_dir"] = str(self.state_dir)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> LabConfig:
        data = json.loads(text)
        data["state_dir"] = Path(data["state_dir"])
        data["image"] = Image(data["image"])
        data["accel"] = Accel(data["accel"])
        data["data_net"] = DataNet(data["data_net"])
        return cls(**data)


def _lab_byte(lab: str) -> int:
    """A stable byte per lab name so two labs on one host never share MAC addresses."""
    import hashlib

    return hashlib.sha256(lab.encode()).digest()[0]
