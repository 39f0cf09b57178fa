"""The lab's configuration: one frozen value, parsed and validated once, passed explicitly.

Everything that names a node (its MAC addresses, tap, SSH port, data IP) is derived here and
nowhere else, so Terraform, the VM launcher, cloud-init and the inventory cannot disagree.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infra import lab_settings
from infra.errors import LabError
from infra.lab_settings import Accel, DataNet, Extras, Image

__all__ = ["Accel", "DataNet", "Extras", "Image", "LabConfig", "Node", "REPO"]

REPO = Path(__file__).resolve().parent.parent
VM_USER = "lab"  # not "rdma": rdma-core owns that group and useradd would fail
RDMA_DEVICE = "rxe0"
DATA_NIC = "data0"  # the lab's data NIC, renamed by MAC (network-config); rxe sits on it
MGMT_NIC = "mgmt0"
RDMA_PORT = 1
GID_INDEX = 1  # the IPv4-mapped RoCEv2 GID; index 0 is the link-local one
VDE_MAX_MTU = 1500  # vde_switch's packet buffer (VDE_MTU 1504) holds no bigger frame


def default_state_dir() -> Path:
    return Path(str(lab_settings.value("RXELAB_STATE") or REPO / lab_settings.STATE_DIR)).resolve()


def cache_dir() -> Path:
    """Absolute but not resolved: the links on the way are owned_paths.cache_subdir's to
    check (resolved here, a link another user owns would never be looked at)."""
    base = lab_settings.value("RXELAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "rxelab"
    )
    path = Path(str(base))
    return path if path.is_absolute() else Path.cwd() / path


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

    @property
    def mgmt_net(self) -> str:
        """The node's own user-net subnet: every node's management address differs (10.0.2.15,
        10.0.3.15, ...), as on a real cluster. Open MPI 5's runtime (PRRTE) takes the other
        nodes' daemons for one node when they report an address in common, so the 10.0.2.15
        every node had made node2 and node3 one (its head node is another matter:
        experiments.running.commands.mpi_hosts)."""
        return f"10.0.{self.index + 1}.0/24"


def _default(name: str) -> Any:
    """A lab setting's default, from the settings table (infra/lab_settings.py)."""
    return lab_settings.BY_FIELD[name].default_value


@dataclass(frozen=True)
class LabConfig:
    """One lab. Its fields, their defaults and their ranges are declared in infra/lab_settings.py;
    every value is checked there (Setting.check), once per LabConfig made."""

    nodes: int = _default("nodes")
    image: Image = _default("image")
    extras: Extras = _default("extras")
    accel: Accel = _default("accel")
    mem_mb: int = _default("mem_mb")
    data_net: DataNet = _default("data_net")
    mtu: int = _default("mtu")
    lab: str = _default("lab")
    ssh_port_base: int = _default("ssh_port_base")
    subnet: str = "10.10.0.0/24"
    state_dir: Path = field(default_factory=default_state_dir)

    def __post_init__(self) -> None:
        for s in lab_settings.LAB_SETTINGS:
            s.check(getattr(self, s.field))  # raises naming the setting and its range
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", self.lab):
            raise LabError(
                f"lab name {self.lab!r} is not usable",
                hint="1-8 lower-case letters or digits, starting with a letter",
            )
        net = ipaddress.ip_network(self.subnet, strict=True)
        if net.num_addresses < 32:
            raise LabError(f"data subnet {self.subnet} is too small", hint="use a /27 or larger")

    @classmethod
    def from_strings(cls, *, state_dir: Path | None = None, **typed: str | int) -> LabConfig:
        """Build from user-typed values (Make variables, CLI flags), keyed by field name, with
        clear errors; missing ones take the table's defaults."""
        unknown = sorted(typed.keys() - lab_settings.BY_FIELD.keys())
        if unknown:
            raise LabError(f"unknown lab settings {unknown}")
        values = {f: s.convert(typed[f]) for f, s in lab_settings.BY_FIELD.items() if f in typed}
        return cls(**values, **({"state_dir": state_dir} if state_dir else {}))  # type: ignore[arg-type]

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
        data["extras"] = Extras(data.get("extras", Extras.NONE))  # labs made before EXTRAS
        data["accel"] = Accel(data["accel"])
        data["data_net"] = DataNet(data["data_net"])
        return cls(**data)


def _lab_byte(lab: str) -> int:
    """A stable byte per lab name so two labs on one host never share MAC addresses."""
    return hashlib.sha256(lab.encode()).digest()[0]
