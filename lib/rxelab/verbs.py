"""The verbs resources, and the only module that imports pyverbs: the device (context,
protection domain, completion queue, port and GID), registered memory with a registration
cache, and one RC queue pair per peer.

Modelled on rdma-core's tests/base.py: the same QP attributes (MTU from the port, timeout,
retry and RNR settings), the same RESET->INIT->RTR->RTS walk, and INIT before any receive is
posted (rxe rejects post_recv in RESET).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ, cqe_status_to_str
from pyverbs.device import Context, get_device_list
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from rxelab.buffers import Buffer
from rxelab.errors import ConfigError, RdmaError

TIMEOUT = 16  # 4.096 us * 2^16 = 268 ms per ack timeout: generous under emulation
RETRY_CNT = 7
RNR_RETRY = 7  # 7 = retry forever on receiver-not-ready
MIN_RNR_TIMER = 12
ACCESS_REMOTE = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
SLOT_BYTES = 64  # one control message


def status_str(status: int) -> str:
    try:
        return str(cqe_status_to_str(status))
    except Exception:  # noqa: BLE001 - an unknown code must still be reported
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


def _is_ipv4_mapped(gid: str) -> bool:
    return gid.startswith("0000:0000:0000:0000:0000:ffff:")


class Device:
    """Context + PD + one CQ, on the first ACTIVE port unless told otherwise."""

    def __init__(self, name: str | None = None, port: int | None = None,
                 gid_index: int | None = None, cq_depth: int = 8192) -> None:
        self.ctx: Any = None
        try:
            self.name, self.port = self._choose(name, port)
            self.ctx = Context(name=self.name)
            attr = self.ctx.query_port(self.port)
            self.mtu = attr.active_mtu
            self.lid = attr.lid
            self.gid_index = self._choose_gid(gid_index, attr.gid_tbl_len)
            self.gid = str(self.ctx.query_gid(self.port, self.gid_index))
            self.max_cqe = int(self.ctx.query_device().max_cqe)
            self.pd = PD(self.ctx)
            self.cq = CQ(self.ctx, min(cq_depth, self.max_cqe))
        except PyverbsError as err:
            self.close()
            raise RdmaError(f"cannot open RDMA device {name or '(auto)'}: {err}") from None

    def _choose(self, name: str | None, port: int | None) -> tuple[str, int]:
        names = [d.name.decode() if isinstance(d.name, bytes) else str(d.name)
                 for d in get_device_list()]
        if not names:
            raise ConfigError("no RDMA device on this host",
                              hint="load rdma_rxe and `rdma link add rxe0 type rxe netdev <if>`")
        if name is not None and name not in names:
            raise ConfigError(f"no RDMA device named {name!r}", hint=f"devices: {', '.join(names)}")
        for candidate in [name] if name else names:
            ctx = Context(name=candidate)
            try:
                ports = [port] if port else range(1, ctx.query_device().phys_port_cnt + 1)
                for p in ports:
                    if ctx.query_port(p).state == e.IBV_PORT_ACTIVE:
                        return candidate, p
            finally:
                ctx.close()
        raise ConfigError(f"no ACTIVE port on {name or ', '.join(names)}")

    def _choose_gid(self, index: int | None, table_len: int) -> int:
        if index is not None:
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
        for name in ("cq", "pd", "ctx"):
            res = getattr(self, name, None)
            if res is not None:
                res.close()
                setattr(self, name, None)


class Registry:
    """Memory registration cache, keyed by (address, length, access).

    Holding the owner object keeps its memory from being freed and reused under a stale
    registration. Least recently used entries are dropped above `limit` pinned bytes.
    """

    def __init__(self, pd: Any, limit: int) -> None:
        self.pd = pd
        self.limit = limit
        self.entries: OrderedDict[tuple[int, int, int], tuple[Any, Any]] = OrderedDict()
        self.pinned = 0
        self.peak = 0
        self.registrations = 0

    def register(self, buf: Buffer, access: int) -> Any:
        key = (buf.address, buf.nbytes, access)
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
            return hit[0]
        try:
            mr = MR(self.pd, buf.nbytes, access, address=buf.address)
        except PyverbsError as err:
            raise RdmaError(f"registering {buf.nbytes} bytes failed: {err}",
                            hint="memlock limit? (ulimit -l)") from None
        self.registrations += 1
        self.entries[key] = (mr, buf.owner)
        self.pinned += buf.nbytes
        self.peak = max(self.peak, self.pinned)
        while self.pinned > self.limit and len(self.entries) > 1:
            (_, size, _), (old, _) = self.entries.popitem(last=False)
            old.close()
            self.pinned -= size
        return mr

    def add_fixed(self, nbytes: int) -> None:
        """Memory the library pins for itself (control slabs) counts too."""
        self.pinned += nbytes
        self.peak = max(self.peak, self.pinned)

    def close(self) -> None:
        for mr, _ in self.entries.values():
            mr.close()
        self.entries.clear()


class Connection:
    """One RC QP to one peer, with a slab of receive slots for control messages and
    write-with-immediate notices, and a slab of send slots for outgoing control messages."""

    def __init__(self, dev: Device, registry: Registry, peer: int, slots: int, send_depth: int) -> None:
        self.peer = peer
        self.dev = dev
        self.slots = slots
        self.qp: Any = None
        self.recv_mr = MR(dev.pd, slots * SLOT_BYTES, e.IBV_ACCESS_LOCAL_WRITE)
        self.send_mr = MR(dev.pd, slots * SLOT_BYTES, e.IBV_ACCESS_LOCAL_WRITE)
        registry.add_fixed(2 * slots * SLOT_BYTES)
        cap = QPCap(max_send_wr=send_depth, max_recv_wr=slots, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(dev.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=dev.cq, rcq=dev.cq, cap=cap,
                                         sq_sig_all=1))
        self.psn = random.getrandbits(24)
        attr = QPAttr(port_num=dev.port)
        attr.qp_access_flags = ACCESS_REMOTE
        self.qp.to_init(attr)
        # pyverbs' WR and SGE objects leak their C memory (rdma-core <= 50): make them once.
        self.recv_wrs = [
            RecvWR(wr_id=(peer << 32) | i, num_sge=1,
                   sg=[SGE(self.recv_mr.buf + i * SLOT_BYTES, SLOT_BYTES, self.recv_mr.lkey)])
            for i in range(slots)
        ]
        for wr in self.recv_wrs:
            self.qp.post_recv(wr)
        self.sge = SGE(0, 0, 0)
        self.wr = SendWR(num_sge=1, sg=[self.sge])
        self.wr.sg_list = self.sge  # from now on the WR reads this SGE: mutate, post, repeat
        self.free_send_slots = list(range(slots))

    def endpoint(self) -> Endpoint:
        return Endpoint(self.qp.qp_num, self.psn, self.dev.gid, self.dev.lid)

    def connect(self, remote: Endpoint) -> None:
        self.remote = remote
        attr = QPAttr(port_num=self.dev.port)
        attr.qp_access_flags = ACCESS_REMOTE
        attr.path_mtu = self.dev.mtu
        attr.dest_qp_num = remote.qpn
        attr.rq_psn = remote.psn
        attr.sq_psn = self.psn
        attr.max_dest_rd_atomic = 1
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = MIN_RNR_TIMER
        attr.timeout = TIMEOUT
        attr.retry_cnt = RETRY_CNT
        attr.rnr_retry = RNR_RETRY
        gr = GlobalRoute(dgid=GID(remote.gid), sgid_index=self.dev.gid_index, hop_limit=64)
        attr.ah_attr = AHAttr(port_num=self.dev.port, is_global=1, gr=gr, dlid=remote.lid)
        try:
            self.qp.to_rts(attr)
        except PyverbsError as err:
            raise RdmaError(f"connecting the QP to rank {self.peer} failed: {err}") from None

    def repost(self, slot: int) -> None:
        self.qp.post_recv(self.recv_wrs[slot])

    def slot_bytes(self, slot: int, length: int) -> bytes:
        return bytes(self.recv_mr.read(length, slot * SLOT_BYTES))

    def post(self, wr_id: int, opcode: int, addr: int, length: int, lkey: int,
             remote_addr: int = 0, rkey: int = 0, imm: int = 0) -> None:
        self.sge.addr, self.sge.length, self.sge.lkey = addr, length, lkey
        self.wr.wr_id = wr_id
        self.wr.opcode = opcode
        self.wr.imm_data = imm
        self.wr.send_flags = e.IBV_SEND_SIGNALED
        if opcode in (e.IBV_WR_RDMA_WRITE, e.IBV_WR_RDMA_WRITE_WITH_IMM):
            self.wr.set_wr_rdma(rkey, remote_addr)
        self.qp.post_send(self.wr)

    def close(self) -> None:
        for res in (self.qp, self.recv_mr, self.send_mr):
            if res is not None:
                res.close()
        self.qp = None
