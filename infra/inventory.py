"""The inventory: the one file everything downstream (Fabric, tests, `make status`) reads.

The same format names the lab's VMs or machines that already exist (real RoCE or InfiniBand
hosts, cloud VMs), so a user outgrows one machine by writing a file, not by changing code.
It is strict: an unknown key or a bad value is an error that names where it is.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.config import GID_INDEX, RDMA_DEVICE, RDMA_PORT, VM_USER, LabConfig
from infra.errors import LabError
from infra.state import LabState, write_atomic

VERSION = 1
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


@dataclass(frozen=True)
class SSHEndpoint:
    host: str
    port: int = 22
    user: str = VM_USER
    key: str | None = None
    known_hosts: str | None = None


@dataclass(frozen=True)
class RdmaEndpoint:
    device: str = RDMA_DEVICE
    port: int = RDMA_PORT
    gid_index: int = GID_INDEX


@dataclass(frozen=True)
class Host:
    name: str
    ssh: SSHEndpoint
    data_ip: str
    rdma: RdmaEndpoint


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
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise LabError(f"no inventory at {path}",
                       hint="run `make provision`, or point INVENTORY= at your own file") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise LabError(f"{path} is not valid JSON: {e}") from None
    return parse(doc, source=str(path))


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def fail(self, where: str, what: str) -> None:
        self.problems.append(f"{where}: {what}")

    def obj(self, value: Any, where: str, required: set[str], optional: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, "must be an object")
            return {}
        for key in sorted(required - value.keys()):
            self.fail(where, f"missing key {key!r}")
        for key in sorted(value.keys() - required - optional):
            self.fail(where, f"unknown key {key!r}")
        return value

    def integer(self, value: Any, where: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(where, f"must be a whole number from {low} to {high}, not {value!r}")
            return low
        return value

    def text(self, value: Any, where: str, pattern: re.Pattern[str] | None = None) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(where, f"must be a non-empty string, not {value!r}")
            return ""
        if pattern and not pattern.fullmatch(value):
            self.fail(where, f"{value!r} is not a valid name")
        return value


def parse(doc: Any, source: str = "inventory") -> Inventory:
    c = _Checker(source)
    top = c.obj(doc, "top level", {"version", "nodes"}, {"lab"})
    if top.get("version", VERSION) != VERSION:
        c.fail("version", f"this rxelab reads version {VERSION}, not {top.get('version')!r}")
    lab = c.text(top.get("lab", "custom"), "lab")
    nodes = top.get("nodes", [])
    if not isinstance(nodes, list) or not nodes:
        c.fail("nodes", "must be a non-empty list")
        nodes = []
    hosts = []
    for i, raw in enumerate(nodes):
        w = f"nodes[{i}]"
        n = c.obj(raw, w, {"name", "ssh", "data_ip"}, {"rdma"})
        name = c.text(n.get("name"), f"{w}.name", NAME_RE)
        s = c.obj(n.get("ssh", {}), f"{w}.ssh", {"host"}, {"port", "user", "key", "known_hosts"})
        ssh = SSHEndpoint(
            host=c.text(s.get("host"), f"{w}.ssh.host"),
            port=c.integer(s.get("port", 22), f"{w}.ssh.port", 1, 65535),
            user=c.text(s.get("user", VM_USER), f"{w}.ssh.user"),
            key=c.text(s["key"], f"{w}.ssh.key") if "key" in s else None,
            known_hosts=c.text(s["known_hosts"], f"{w}.ssh.known_hosts") if "known_hosts" in s else None,
        )
        data_ip = c.text(n.get("data_ip"), f"{w}.data_ip")
        try:
            ipaddress.ip_address(data_ip)
        except ValueError:
            if data_ip:
                c.fail(f"{w}.data_ip", f"{data_ip!r} is not an IP address")
        r = c.obj(n.get("rdma", {}), f"{w}.rdma", set(), {"device", "port", "gid_index"})
        rdma = RdmaEndpoint(
            device=c.text(r.get("device", RDMA_DEVICE), f"{w}.rdma.device"),
            port=c.integer(r.get("port", RDMA_PORT), f"{w}.rdma.port", 1, 255),
            gid_index=c.integer(r.get("gid_index", GID_INDEX), f"{w}.rdma.gid_index", 0, 255),
        )
        hosts.append(Host(name, ssh, data_ip, rdma))
    names = [h.name for h in hosts]
    for dup in sorted({x for x in names if names.count(x) > 1}):
        c.fail("nodes", f"name {dup!r} is used more than once")
    endpoints = [(h.ssh.host, h.ssh.port) for h in hosts]
    for dup in sorted({x for x in endpoints if endpoints.count(x) > 1}):
        c.fail("nodes", f"SSH endpoint {dup[0]}:{dup[1]} is used more than once")
    if c.problems:
        shown = "\n  ".join(c.problems[:20])
        raise LabError(f"{source} is not a valid inventory:\n  {shown}")
    return Inventory(lab, tuple(hosts))
