"""What a rank's CPU spends per message, per copied and per reduced byte, and per call: the
costs a replay charges as computation on the rank's host. Piecewise linear in the message's
size, by segments, as SMPI's os/or are fitted (SimGrid's "Calibrating the models"). A profile
holds them with the link they were measured on; `fab calibrate` writes one from the lab, and
PLACEHOLDER stands in (and says so in every result) until one is made."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from experiments.simulation.platforms import Platform


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class Segment:
    upto: int  # bytes: messages up to this size (the last segment: any size)
    fixed: float  # seconds per message
    per_byte: float  # seconds per byte


@dataclass(frozen=True)
class Costs:
    send: tuple[Segment, ...]
    recv: tuple[Segment, ...]
    copy_per_byte: float = 0.0
    reduce_per_byte: float = 0.0
    call: float = 0.0  # seconds of a call's own, before its first message (0-byte call)

    def send_cpu(self, nbytes: int) -> float:
        return _at(self.send, nbytes)

    def recv_cpu(self, nbytes: int) -> float:
        return _at(self.recv, nbytes)


def _at(segments: tuple[Segment, ...], nbytes: int) -> float:
    for s in segments:
        if nbytes <= s.upto:
            return s.fixed + s.per_byte * nbytes
    last = segments[-1]
    return last.fixed + last.per_byte * nbytes


@dataclass(frozen=True)
class Profile:
    """Costs, and the link and CPUs they were measured with."""

    name: str
    costs: Costs
    bandwidth: float  # bytes/s of the link one way (ib_write_bw)
    latency: float  # seconds
    node_cpus: int = 1  # each node's (nproc)
    host_cpus: int | None = None  # the machine's cores where the nodes are its VMs (the lab)
    duplex_bandwidth: float | None = None  # bytes/s both ways at once (ib_write_bw -b's sum)
    measured: dict[str, Any] = field(default_factory=dict)  # what it was fitted from
    loop_bandwidth: float | None = None  # bytes/s within one node (ib_write_bw on rxe's loopback)
    cpu_per_byte: float | None = None  # CPU s a byte costs each side (None: all 1/duplex's)
    path_bandwidth: float | None = None  # bytes/s through a VM's data path, sent and received
    wake: float | None = None  # CPU s a blocked rank spends to run again, the others wanting all

    def lab(self, ranks: int, per_node: int = 1) -> Platform:
        """The `lab` platform of this profile's nodes: VMs of `node_cpus` CPUs on a machine of
        `host_cpus` cores, which the busy ones share. A message's bytes cost the sending VM
        and the receiving one, at once, the CPU the calibration measured per byte, and pass
        through each VM's data path, which its sends and receives share at the rate the
        calibration's own exchanges showed. A profile without the CPU per byte (fitted before
        the calibration measured it) charges the link's rate both ways at once to the CPU
        (the sum: each VM sends and receives half of it; one way where both were not
        measured): a byte costs each side 1/sum. Between two ranks of one VM, a byte costs
        that VM (both sides are on it) what its loopback measured. Where the VMs' CPUs
        outnumber the machine's cores, a rank that blocked spends `wake` of CPU running
        again once what it waited for came, times the share of the machine's cores the other
        VMs want then (the calibration's exchange beside busy VMs: all of them)."""
        return Platform("lab", ranks, self.duplex_bandwidth or self.bandwidth, self.latency,
                        cores=self.node_cpus,
                        per_node=per_node, machine_cores=self.host_cpus or 0,
                        loop_bandwidth=self.loop_bandwidth or 0.0,
                        cpu_per_byte=self.cpu_per_byte or 0.0,
                        path_bandwidth=self.path_bandwidth or 0.0, wake=self.wake or 0.0)

    @property
    def placeholder(self) -> bool:
        return self.name == PLACEHOLDER.name

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def load(path: Path) -> Profile:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"platform profile {path}: not there yet: `fab calibrate --profile "
                           f"{path.stem}` measures the lab and writes it") from None
    except (OSError, ValueError) as err:
        raise ProfileError(f"platform profile {path}: {err}") from None
    try:
        c = raw["costs"]
        costs = Costs(tuple(_segments(c["send"], "send")), tuple(_segments(c["recv"], "recv")),
                      _number(c.get("copy_per_byte", 0.0), "copy_per_byte"),
                      _number(c.get("reduce_per_byte", 0.0), "reduce_per_byte"),
                      _number(c.get("call", 0.0), "call"))
        node_cpus, host_cpus = raw.get("node_cpus", 1), raw.get("host_cpus")
        for what, cpus in (("node_cpus", node_cpus), ("host_cpus", host_cpus)):
            if (cpus is not None or what == "node_cpus") and (
                    isinstance(cpus, bool) or not isinstance(cpus, int) or not 1 <= cpus <= 1024):
                raise ProfileError(f"{what}={cpus!r}: a whole number from 1 to 1024")
        duplex = raw.get("duplex_bandwidth")
        loop = raw.get("loop_bandwidth")
        per_byte, path = raw.get("cpu_per_byte"), raw.get("path_bandwidth")
        if (per_byte is None) != (path is None):
            raise ProfileError("cpu_per_byte and path_bandwidth: both or neither (a byte's "
                               "CPU and the rest of its time go together)")
        wake = raw.get("wake")
        measured = raw.get("measured") or {}
        if not isinstance(measured, dict):
            raise ProfileError(f"measured={measured!r}: a table of what it was fitted from")
        profile = Profile(str(raw["name"]), costs, _number(raw["bandwidth"], "bandwidth", True),
                          _number(raw["latency"], "latency", True), node_cpus, host_cpus,
                          None if duplex is None else _number(duplex, "duplex_bandwidth", True),
                          measured, None if loop is None else _number(loop, "loop_bandwidth", True),
                          None if per_byte is None else _number(per_byte, "cpu_per_byte", True),
                          None if path is None else _number(path, "path_bandwidth", True),
                          None if wake is None else _number(wake, "wake"))
    except ProfileError as err:
        raise ProfileError(f"platform profile {path}: {err}") from None
    except (KeyError, TypeError, AttributeError) as err:
        raise ProfileError(f"platform profile {path}: missing or malformed {err}") from None
    return profile


def _number(value: Any, what: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise ProfileError(f"{what}={value!r}: a number {'above' if positive else 'from'} 0")
    return float(value)


def _segments(raw: Any, what: str) -> list[Segment]:
    if not isinstance(raw, list) or not raw:
        raise ProfileError(f"{what}: a list of [upto, fixed, per_byte] segments")
    out = []
    for item in raw:
        if isinstance(item, dict):
            item = [item.get("upto"), item.get("fixed"), item.get("per_byte")]
        if not isinstance(item, (list, tuple)) or len(item) != 3:
            raise ProfileError(f"{what}: a segment is [upto, fixed, per_byte], not {item!r}")
        upto = _number(item[0], f"{what} upto")
        if upto != int(upto) or upto > 1 << 62:
            raise ProfileError(f"{what} upto={item[0]!r}: a whole number of bytes")
        fixed = item[1]  # may be below 0: checked with the segment's start below
        if isinstance(fixed, bool) or not isinstance(fixed, (int, float)) \
                or not math.isfinite(fixed):
            raise ProfileError(f"{what} fixed={fixed!r}: a number")
        out.append(Segment(int(upto), float(fixed), _number(item[2], f"{what} per_byte")))
    if [s.upto for s in out] != sorted({s.upto for s in out}):
        raise ProfileError(f"{what}: segments in ascending order of size, each once")
    # a segment's line may start below 0 (fitted through two points), its costs may not
    for before, s in zip([Segment(0, 0.0, 0.0), *out], out, strict=False):
        if s.fixed + s.per_byte * before.upto < -1e-12:  # a fitted line's rounding is not a cost
            raise ProfileError(f"{what}: the segment up to {s.upto} B costs less than nothing "
                               f"at {before.upto} B")
    return out


# Round numbers, not measurements: what a replay uses until `fab calibrate` made a profile.
PLACEHOLDER = Profile(
    "placeholder",
    Costs(send=(Segment(65536, 5e-6, 1e-10), Segment(1 << 62, 10e-6, 1e-10)),
          recv=(Segment(65536, 5e-6, 1e-10), Segment(1 << 62, 10e-6, 1e-10)),
          copy_per_byte=1e-10, reduce_per_byte=5e-10, call=10e-6),
    bandwidth=12.5e9, latency=1e-6)

