"""The verbs resources, and the only module that imports pyverbs: the device (context,
protection domain, completion queue, port and GID), registered memory with a registration
cache, and one RC queue pair per peer.

Modelled on rdma-core's tests/base.py: the same QP attributes (MTU from the port, timeout,
retry and RNR settings), the same RESET->INIT->RTR->RTS walk, and INIT before any receive is
posted (rxe rejects post_recv in RESET).
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from typing import Any

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ, CompChannel, cqe_status_to_str
from pyverbs.device import Context, get_device_list
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from rxelab import messages
from rxelab.errors import ConfigError, RdmaError
from rxelab.settings import BY_NAME, TRANSPORT_ENV
from rxelab.transports import base, verbs_port
from rxelab.transports.base import ACCESS_LOCAL_WRITE, ACCESS_REMOTE, WR_RDMA_WRITE, WR_RDMA_WRITE_WITH_IMM

# the engine posts and reads these numbers without pyverbs: this pyverbs must agree
_wrong = base.abi_differences(e)
if _wrong:
    raise ImportError("this pyverbs disagrees with libibverbs' numbers rxelab was written for: "
                      + "; ".join(_wrong))

QP_TIMEOUT = int(BY_NAME["qp_timeout"].default)  # init()'s options: the one place
RETRY_CNT = int(BY_NAME["retry_cnt"].default)
RNR_RETRY = 7  # 7 = retry forever on receiver-not-ready
MIN_RNR_TIMER = 12
WR_CACHE = 256  # send WRs kept per connection
# what a host without an RDMA device, or without an ACTIVE port, can do about it
NO_DEVICE = ("SoftRoCE makes one over an Ethernet interface: `sudo modprobe rdma_rxe && sudo "
             "rdma link add rxe0 type rxe netdev <if>`; on a machine without RDMA, use "
             f'transport="tcp" ({TRANSPORT_ENV}=tcp)')
log = logging.getLogger(__name__)


def status_str(status: int) -> str:
    try:
        return str(cqe_status_to_str(status))
    except Exception:  # an unknown code must still be reported
        return f"status {status}"


@dataclass(frozen=True)
class Endpoint:
    """What a peer needs to connect to one of our QPs."""

    qpn: int
    psn: int
    gid: str
    lid: int

    def to_dict(self) -> dict[str, Any]:
        return {"qpn": self.qpn, "psn": self.psn, "gid": self.gid, "lid": self.lid}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Endpoint:
        return cls(int(d["qpn"]), int(d["psn"]), str(d["gid"]), int(d["lid"]))


def _fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return out


def _is_ipv4_mapped(gid: str) -> bool:
    return gid.startswith("0000:0000:0000:0000:0000:ffff:")


class Device:
    """Context + PD + one CQ, on the first ACTIVE port unless told otherwise. The CQ has a
    completion channel, so a waiting rank can sleep in the kernel until a completion comes
    (see Engine.wait) instead of spinning on a vCPU that the peers' VMs need."""

    def __init__(self, name: str | None = None, port: int | None = None,
                 gid_index: int | None = None, cq_depth: int = 8192) -> None:
        self.ctx: Any = None
        try:
            self.name, self.port = self._choose(name, port)
            self.ctx = Context(name=self.name)
            attr = self.ctx.query_port(self.port)
            self.mtu_enum = attr.active_mtu  # an IBV_MTU_* (IBV_MTU_4096 is 5), not bytes
            self.lid = attr.lid
            self.gid_index = self._choose_gid(gid_index, attr.gid_tbl_len)
            self.gid = str(self.ctx.query_gid(self.port, self.gid_index))
            self.max_cqe = int(self.ctx.query_device().max_cqe)
            self.pd = PD(self.ctx)
            self.channel, self.channel_fd = self._open_channel()
            depth = min(cq_depth, self.max_cqe)
            self.cq = CQ(self.ctx, depth, None, self.channel, 0) if self.channel else \
                CQ(self.ctx, depth)
        except PyverbsError as err:
            self.close()
            raise RdmaError(f"cannot open RDMA device {name or '(auto)'}: {err}") from None
        except BaseException:  # a port or GID refused in words (rxelab.transports.verbs_port)
            self.close()
            raise
        log.debug("device %s port %d: GID index %d (%s), LID %d, MTU enum %d, %s", self.name,
                  self.port, self.gid_index, self.gid, self.lid, self.mtu_enum,
                  "a completion channel" if self.channel else "polling (no completion channel)")

    def _open_channel(self) -> tuple[Any, int | None]:
        """A completion channel and its file descriptor (pyverbs does not expose it: it is
        the new 'infinibandevent' descriptor), or (None, None) to poll without sleeping."""
        before = _fds()
        try:
            channel = CompChannel(self.ctx)
        except PyverbsError:
            return None, None
        fd = getattr(channel, "fd", None)
        if fd is None:
            new = [f for f, target in _fds().items() if f not in before and "infinibandevent" in target]
            fd = new[0] if len(new) == 1 else None
        if fd is None:
            channel.close()
            return None, None
        return channel, fd

    def arm(self) -> None:
        """Ask for an event on the channel at the next completion."""
        self.cq.req_notify()

    def take_event(self) -> None:
        self.channel.get_cq_event(self.cq)
        self.cq.ack_events(1)

    def status_str(self, status: int) -> str:
        return status_str(status)

    def _choose(self, name: str | None, port: int | None) -> tuple[str, int]:
        names = _device_names()
        if name is not None and name not in names:
            raise ConfigError(f"no RDMA device named {name!r}", hint=f"devices: {', '.join(names)}")
        seen: dict[str, list[int]] = {}  # each device's ports' states, port 1 first
        for candidate in [name] if name else names:
            ctx = Context(name=candidate)
            try:
                count = ctx.query_device().phys_port_cnt
                seen[candidate] = [ctx.query_port(p).state for p in range(1, count + 1)]
            finally:
                ctx.close()
            found = verbs_port.first_active(seen[candidate], port)
            if found is not None:
                return candidate, found
        raise verbs_port.no_port(seen, name, port)

    def _choose_gid(self, index: int | None, table_len: int) -> int:
        if index is not None:
            verbs_port.check_gid_index(self.name, self.port, index, table_len)
            verbs_port.check_gid(self.name, self.port, index,
                                 str(self.ctx.query_gid(self.port, index)))
            return index
        for i in range(table_len):
            gid = str(self.ctx.query_gid(self.port, i))
            if gid == "0000:0000:0000:0000:0000:0000:0000:0000":
                if i > 0:
                    break
                continue
            v2 = self.ctx.query_gid_type(self.port, i) == e.IBV_GID_TYPE_SYSFS_ROCE_V2
            if v2 and _is_ipv4_mapped(gid):
                return i
        return 0  # InfiniBand, or RoCE without an IPv4 address: the first GID

    def close(self) -> None:
        for name in ("cq", "channel", "pd", "ctx"):
            res = getattr(self, name, None)
            if res is not None:
                res.close()
                setattr(self, name, None)


def _device_names() -> list[str]:
    """The RDMA devices' names, or a ConfigError that says how to make one, however rdma-core
    says there is none: an empty list, or (rdma-core 44, where /sys/class/infiniband is
    missing) an error, "Failed to get devices list"."""
    try:
        devices = get_device_list()
    except PyverbsError as err:
        raise ConfigError(f"no RDMA device on this host (rdma-core: {err})", hint=NO_DEVICE) \
            from None
    names = [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in devices]
    if not names:
        raise ConfigError("no RDMA device on this host", hint=NO_DEVICE)
    return names


def register_mr(pd: Any, address: int, nbytes: int, access: int) -> Any:
    """Register a caller's memory in place (rxelab.registry caches these)."""
    try:
        return MR(pd, nbytes, access, address=address)
    except PyverbsError as err:
        raise RdmaError(f"registering {nbytes} bytes failed: {err}",
                        hint="memlock limit? (ulimit -l)") from None


class Connection(base.SlotState):
    """One RC QP to one peer, with a slab of receive slots (control messages, eager data,
    write-with-immediate notices) and a slab of send slots (control messages and the bounce
    copies of eager data), slot_size bytes each."""

    def __init__(self, dev: Device, registry: Any, peer: int, slots: int, send_depth: int,
                 slot_size: int = messages.CTRL_SLOT) -> None:
        self.peer = peer
        self.dev = dev
        self.slot_size = slot_size
        self.qp: Any = None
        self.recv_mr = MR(dev.pd, slots * slot_size, ACCESS_LOCAL_WRITE)
        self.send_mr = MR(dev.pd, slots * slot_size, ACCESS_LOCAL_WRITE)
        self.recv_base, self.send_base = self.recv_mr.buf, self.send_mr.buf
        registry.add_fixed(2 * slots * slot_size)  # messages.ring_bytes
        cap = QPCap(max_send_wr=send_depth, max_recv_wr=slots, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(dev.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=dev.cq, rcq=dev.cq, cap=cap,
                                         sq_sig_all=0))
        self.psn = random.getrandbits(24)
        attr = QPAttr(port_num=dev.port)
        attr.qp_access_flags = ACCESS_REMOTE
        self.qp.to_init(attr)
        # One receive WR per slot, made once: each owns a copy of its SGE.
        self.recv_wrs = [
            RecvWR(wr_id=(peer << 32) | i, num_sge=1,
                   sg=[SGE(self.recv_base + i * slot_size, slot_size, self.recv_mr.lkey)])
            for i in range(slots)
        ]
        for wr in self.recv_wrs:
            self.qp.post_recv(wr)
        super().__init__(slots)
        self.wrs: dict[tuple[int, int, int], Any] = {}

    def endpoint(self) -> Endpoint:
        return Endpoint(self.qp.qp_num, self.psn, self.dev.gid, self.dev.lid)

    def connect(self, remote: Endpoint, qp_timeout: int = QP_TIMEOUT,
                retry_cnt: int = RETRY_CNT) -> None:
        self.remote = remote
        attr = QPAttr(port_num=self.dev.port)
        attr.qp_access_flags = ACCESS_REMOTE
        attr.path_mtu = self.dev.mtu_enum
        attr.dest_qp_num = remote.qpn
        attr.rq_psn = remote.psn
        attr.sq_psn = self.psn
        attr.max_dest_rd_atomic = 1
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = MIN_RNR_TIMER
        attr.timeout = qp_timeout
        attr.retry_cnt = retry_cnt
        attr.rnr_retry = RNR_RETRY
        gr = GlobalRoute(dgid=GID(remote.gid), sgid_index=self.dev.gid_index, hop_limit=64)
        attr.ah_attr = AHAttr(port_num=self.dev.port, is_global=1, gr=gr, dlid=remote.lid)
        try:
            self.qp.to_rts(attr)
        except PyverbsError as err:
            raise RdmaError(f"connecting the QP to rank {self.peer} failed: {err}") from None
        log.debug("QP %d connected to rank %d's QP %d at GID %s", self.qp.qp_num, self.peer,
                  remote.qpn, remote.gid)

    def repost(self, slot: int) -> None:
        self.qp.post_recv(self.recv_wrs[slot])

    def slot_bytes(self, slot: int, length: int) -> bytes:
        return bytes(self.recv_mr.read(length, slot * self.slot_size))

    def post(self, wr_id: int, opcode: int, addr: int, length: int, lkey: int,
             remote_addr: int = 0, rkey: int = 0, imm: int = 0, signaled: bool = True) -> None:
        # A WR per (address, length, key), kept for the next post of the same memory (a
        # repeated collective posts the same slots and blocks again). Each WR made its own
        # copy of its SGE: pointing a reused WR at a reused SGE (wr.sg_list = sge) would make
        # both free one pointer on rdma-core versions whose objects have destructors.
        key = (addr, length, lkey)
        wr = self.wrs.get(key)
        if wr is None:
            if len(self.wrs) >= WR_CACHE:
                self.wrs.clear()
            wr = self.wrs[key] = SendWR(num_sge=1, sg=[SGE(addr, length, lkey)])
        wr.wr_id = wr_id
        wr.opcode = opcode
        wr.imm_data = imm
        wr.send_flags = e.IBV_SEND_SIGNALED if signaled else 0
        if opcode == WR_RDMA_WRITE or opcode == WR_RDMA_WRITE_WITH_IMM:
            wr.set_wr_rdma(rkey, remote_addr)
        self.qp.post_send(wr)

    def close(self) -> None:
        for res in (self.qp, self.recv_mr, self.send_mr):
            if res is not None:
                res.close()
        self.qp = None


class VerbsFabric:
    """The verbs transport (rxelab.transports.base.Fabric): rxe or any RDMA NIC."""

    name = "verbs"

    def __init__(self, name: str | None, port: int | None, gid_index: int | None,
                 cq_depth: int) -> None:
        self.device = Device(name, port, gid_index, cq_depth=cq_depth)
        self.conns: dict[int, Connection] = {}

    def register(self, address: int, nbytes: int, access: int) -> Any:
        return register_mr(self.device.pd, address, nbytes, access)

    def connection(self, registry: Any, peer: int, slots: int, send_depth: int,
                   slot_size: int) -> Connection:
        conn = self.conns[peer] = Connection(self.device, registry, peer, slots, send_depth,
                                             slot_size=slot_size)
        return conn

    def connect(self, remote: dict[int, dict[str, Any]], meeting: base.Meeting) -> None:
        for peer, ep in remote.items():
            self.conns[peer].connect(Endpoint.from_dict(ep), meeting.qp_timeout, meeting.retry_cnt)

    def close(self) -> None:
        self.device.close()
