"""The inventory: the one file everything downstream (Fabric, tests, `make status`) reads.

The same format names the lab's VMs or machines that already exist (real RoCE or InfiniBand
hosts, cloud VMs), so a user outgrows one machine by writing a file, not by changing code.
Its values reach ssh's command line and remote shells, so every field has a strict type and
pattern (pydantic models: unknown keys, wrong types and bad values are errors that name the
field's path), and a Host cannot exist with a value that is not valid.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, Strict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from infra import documents
from infra.config import GID_INDEX, RDMA_DEVICE, RDMA_PORT, VM_USER, LabConfig
from infra.documents import spell
from infra.errors import LabError
from infra.state import LabState, write_atomic

VERSION = 1
MAX_BYTES = documents.MAX_BYTES
MAX_NODES = 256


def _pattern(regex: str, what: str) -> Callable[[str], str]:
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not a valid {what}")
        return value
    return check


def _ip_address(value: str) -> str:
    """An address, nothing else: no zone index (`%eth0`), no brackets, no spaces."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address") from None
    if "%" in value:  # Python accepts any text as an IPv6 zone index
        raise ValueError(f"{value!r} has a zone index: give the address alone")
    return str(address)


Name = Annotated[str, AfterValidator(_pattern(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", "name (letters, digits, '.', '_', '-'; 63 at most)"))]
def _host(value: str) -> str:
    """A DNS name or an IP address; never a leading '-' (it would become an ssh option), no
    port ("h:22": the port has a field of its own)."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}", value):
        return value
    try:
        if "%" not in value:
            return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    raise ValueError(f"{value!r} is not a valid host (a DNS name or an IP address; the port "
                     "goes in ssh.port)")


HostName = Annotated[str, AfterValidator(_host)]
UserName = Annotated[str, AfterValidator(_pattern(
    r"[A-Za-z_][A-Za-z0-9._-]{0,31}", "user name (letters, digits, '.', '_', '-')"))]
# A local file for ssh's -i / UserKnownHostsFile: no whitespace (ssh splits the latter on
# it), no '%' (ssh expands tokens), no quotes, no leading '-'.
LocalPath = Annotated[str, AfterValidator(_pattern(
    r"[^\s%'\"\\-][^\s%'\"\\]{0,4095}", "file path (no spaces, quotes or '%')"))]
# The kernel's names for RDMA devices (mlx5_0, rxe0, roce0, irdma-eth1, ...).
Device = Annotated[str, AfterValidator(_pattern(
    r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", "RDMA device name"))]
Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
Small = Annotated[int, Strict(), Field(ge=0, le=255)]
Address = Annotated[str, AfterValidator(_ip_address)]

STRICT = ConfigDict(extra="forbid", str_max_length=4096)


@dataclass(frozen=True, config=STRICT)
class SSHEndpoint:
    host: HostName
    port: Port = 22
    user: UserName = VM_USER
    key: LocalPath | None = None
    known_hosts: LocalPath | None = None


@dataclass(frozen=True, config=STRICT)
class RdmaEndpoint:
    device: Device = RDMA_DEVICE
    port: Annotated[int, Strict(), Field(ge=1, le=255)] = RDMA_PORT
    gid_index: Small = GID_INDEX


@dataclass(frozen=True, config=STRICT)
class Host:
    name: Name
    ssh: SSHEndpoint
    data_ip: Address
    rdma: RdmaEndpoint = RdmaEndpoint()


@dataclass(frozen=True, config=STRICT)
class InventoryFile:
    """The file's shape (version 1)."""

    version: Literal[1]
    nodes: Annotated[tuple[Host, ...], Field(min_length=1, max_length=MAX_NODES)]
    lab: Name = "custom"


FILE = TypeAdapter(InventoryFile)


@dataclass(frozen=True)
class Inventory:
    lab: str
    hosts: tuple[Host, ...]

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        names = ", ".join(h.name for h in self.hosts)
        raise LabError(f"no node named {name!r} in the inventory", hint=f"nodes: {names}")

    def to_json(self) -> str:
        def host(h: Host) -> dict[str, Any]:
            ssh = {k: v for k, v in vars(h.ssh).items() if v is not None}
            return {"name": h.name, "ssh": ssh, "data_ip": h.data_ip, "rdma": vars(h.rdma)}

        doc = {"version": VERSION, "lab": self.lab, "nodes": [host(h) for h in self.hosts]}
        return json.dumps(doc, indent=2) + "\n"


def for_lab(config: LabConfig, state: LabState) -> Inventory:
    return Inventory(
        lab=config.lab,
        hosts=tuple(
            Host(
                name=n.name,
                ssh=SSHEndpoint("127.0.0.1", n.ssh_port, VM_USER, str(state.ssh_key),
                                str(state.known_hosts)),
                data_ip=n.data_ip,
                rdma=RdmaEndpoint(),
            )
            for n in config.all_nodes()
        ),
    )


def save(inventory: Inventory, path: Path) -> None:
    write_atomic(path, inventory.to_json())


def load(path: Path) -> Inventory:
    """Any file a user may point at is one clear error, never a traceback (infra.documents)."""
    if not path.exists() and not path.is_symlink():
        raise LabError(f"no inventory at {path}",
                       hint="run `make provision`, or point INVENTORY= at your own file")
    try:
        doc = documents.load(path, json.loads, "JSON", MAX_BYTES)
    except documents.DocumentError as err:
        raise LabError(f"{path} is not an inventory: {err}") from None
    return parse(doc, source=str(path))


def _problem(error: Any) -> str:
    loc, kind = tuple(error["loc"]), error["type"]
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        return f"{spell(loc[:-1])}: unknown key {loc[-1]!r}"
    if kind in ("missing", "missing_argument"):
        return f"{spell(loc[:-1])}: missing key {loc[-1]!r}"
    if kind == "literal_error" and loc == ("version",):
        return f"version: this rxelab reads version {VERSION}, not {error['input']!r}"
    if kind == "too_short":
        return f"{spell(loc)}: must be a non-empty list"
    if kind == "too_long":
        return f"{spell(loc)}: more than {error['ctx']['max_length']} entries"
    msg = str(error["msg"]).removeprefix("Value error, ")
    if kind.startswith(("int_", "greater_than", "less_than", "string_", "dataclass_")):
        msg = f"{msg}, not {error['input']!r}"[:300]
    return f"{spell(loc)}: {msg}"


def parse(doc: Any, source: str = "inventory") -> Inventory:
    try:
        checked = FILE.validate_python(doc)
    except ValidationError as e:
        problems = [_problem(err) for err in e.errors()]
        shown = "\n  ".join(problems[:20])
        raise LabError(f"{source} is not a valid inventory:\n  {shown}") from None
    hosts = checked.nodes
    problems = []
    names = [h.name for h in hosts]
    for dup in sorted({x for x in names if names.count(x) > 1}):
        problems.append(f"nodes: name {dup!r} is used more than once")
    endpoints = [(h.ssh.host, h.ssh.port) for h in hosts]
    for address, port in sorted({x for x in endpoints if endpoints.count(x) > 1}):
        problems.append(f"nodes: SSH endpoint {address}:{port} is used more than once")
    if problems:
        raise LabError(f"{source} is not a valid inventory:\n  " + "\n  ".join(problems))
    return Inventory(checked.lab, hosts)
