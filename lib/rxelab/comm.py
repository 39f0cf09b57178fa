"""The communicator: what applications hold. init() bootstraps from the launcher's
environment, opens the device, builds a full mesh of RC QPs (endpoints swapped over the TCP
control plane) and returns a Communicator; close() (or the with-block) releases everything
in the right order.

Every collective checks its arguments before anything is posted, and returns the figures
experiments need: bytes sent and received, peak pinned memory, peak bytes in flight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rxelab import bootstrap, verbs
from rxelab.buffers import Buffer, as_buffer, check_pair, split_even
from rxelab.collectives import ALLGATHER, ALLTOALL
from rxelab.collectives.common import DATA, Call, Layout
from rxelab.engine import RTR, Engine
from rxelab.errors import ClosedError, ConfigError, RdmaError
from rxelab.rendezvous import ControlPlane

P2P_BIT = 1 << 31
USER_BIT = 1 << 30


@dataclass(frozen=True)
class Stats:
    operation: str
    algorithm: str
    bytes_sent: int
    bytes_received: int
    peak_pinned: int
    peak_inflight: int
    seconds: float


@dataclass(frozen=True)
class RemoteBuffer:
    """A peer's buffer we may write into (from Communicator.remote)."""

    peer: int
    addr: int
    rkey: int
    length: int


class Communicator:
    def __init__(self, job: bootstrap.JobInfo, *, device: str | None = None,
                 port: int | None = None, gid_index: int | None = None, timeout: float = 60.0,
                 window: int = 4 << 20, chunk: int = 1 << 20, pin_limit: int = 1 << 30,
                 slots: int = 64, send_depth: int = 128) -> None:
        if timeout <= 0 or window <= 0 or chunk <= 0:
            raise ConfigError("timeout, window and chunk must be positive")
        self.rank, self.size = job.rank, job.world_size
        self.job = job
        self.timeout = timeout
        self.closed = False
        self.failed: str | None = None  # set when a collective failed part-way
        self.conns: dict[int, verbs.Connection] = {}
        self.control = ControlPlane(job, timeout)
        self.dev: verbs.Device | None = None
        self.registry: verbs.Registry | None = None
        self.seq = 0
        self.p2p_sent: dict[int, int] = {}
        self.p2p_recv: dict[int, int] = {}
        self.exposed: dict[int, int] = {}  # buffers exposed to each peer
        self.remotes: dict[int, int] = {}  # buffers each peer exposed to us
        self.last_stats: Stats | None = None
        try:
            self.dev = verbs.Device(device, port, gid_index,
                                    cq_depth=max(1024, 2 * self.size * (slots + send_depth)))
            self.registry = verbs.Registry(self.dev.pd, pin_limit)
            for peer in range(self.size):
                if peer != self.rank:
                    self.conns[peer] = verbs.Connection(self.dev, self.registry, peer, slots,
                                                        send_depth)
            remote = self.control.exchange({p: c.endpoint().to_dict() for p, c in self.conns.items()})
            for peer, ep in remote.items():
                self.conns[peer].connect(verbs.Endpoint.from_dict(ep))
            self.engine = Engine(self.dev, self.conns, timeout=timeout,
                                 window=window, chunk=chunk, send_depth=send_depth)
            self.control.barrier()  # every QP is ready to receive before anyone sends
        except BaseException:
            self.close()
            raise

    # ---- lifecycle ------------------------------------------------------------------
    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release QPs, registrations, CQ, PD, context and sockets, children first."""
        if self.closed:
            return
        self.closed = True
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()
        if self.registry is not None:
            self.registry.close()
        if self.dev is not None:
            self.dev.close()
        self.control.close()

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("the communicator is closed")
        if self.failed is not None:
            # Peers may be anywhere in the failed operation: nothing after it can be trusted.
            raise ClosedError(f"the communicator failed earlier ({self.failed}); close it and "
                              f"start a new one")

    # ---- helpers --------------------------------------------------------------------
    def _peer(self, peer: int) -> int:
        if not isinstance(peer, int) or not 0 <= peer < self.size or peer == self.rank:
            raise ConfigError(f"peer {peer!r} is not another rank of 0..{self.size - 1}")
        return peer

    def _mr(self, buf: Buffer, remote: bool) -> Any:
        if buf.nbytes == 0:
            return None
        assert self.registry is not None
        access = verbs.ACCESS_REMOTE if remote else (
            verbs.e.IBV_ACCESS_LOCAL_WRITE if buf.writable else 0)
        return self.registry.register(buf, access)

    def _run(self, operation: str, algorithm: str, table: dict[str, Any], layout: Layout) -> Stats:
        self._check_open()
        if algorithm not in table:
            raise ConfigError(f"unknown {operation} algorithm {algorithm!r}",
                              hint=f"use one of {', '.join(table)}")
        assert self.registry is not None
        counters = self.engine.counters
        sent0, recv0 = counters.bytes_sent, counters.bytes_received
        counters.peak_inflight = counters.inflight
        self.registry.peak = self.registry.pinned
        started = time.perf_counter()
        send_mr = self._mr(layout.send, remote=False)
        recv_mr = self._mr(layout.recv, remote=True)
        self.seq = (self.seq + 1) & 0x3FFF
        call = Call(self.engine, self.rank, self.size, self.seq, f"{operation}/{algorithm}",
                    layout, send_mr, recv_mr)
        try:
            table[algorithm](call)
        except RdmaError as err:
            self.failed = f"{operation}/{algorithm}: {err}"
            self.engine.abort_all(call.tag(DATA))
            raise
        stats = Stats(operation, algorithm, counters.bytes_sent - sent0,
                      counters.bytes_received - recv0, self.registry.peak,
                      counters.peak_inflight, time.perf_counter() - started)
        self.last_stats = stats
        return stats

    # ---- collectives ----------------------------------------------------------------
    def alltoall(self, sendbuf: Any, recvbuf: Any, algorithm: str = "pairwise") -> Stats:
        """MPI_Alltoall: block j of sendbuf goes to rank j; block i of recvbuf comes from rank i."""
        send = as_buffer(sendbuf, "send buffer")
        recv = as_buffer(recvbuf, "receive buffer", writable=True)
        check_pair(send, recv, send.nbytes, send.nbytes)
        m = split_even(send.nbytes, self.size, send.itemsize, "send buffer")
        offs = [i * m for i in range(self.size)]
        lens = [m] * self.size
        return self._run("alltoall", algorithm, ALLTOALL, Layout(send, recv, offs, lens, offs, lens))

    def alltoallv(self, sendbuf: Any, send_counts: list[int], recvbuf: Any,
                  recv_counts: list[int], algorithm: str = "pairwise") -> Stats:
        """MPI_Alltoallv with contiguous blocks: counts are in elements of the buffers."""
        send = as_buffer(sendbuf, "send buffer")
        recv = as_buffer(recvbuf, "receive buffer", writable=True)
        for name, counts in (("send_counts", send_counts), ("recv_counts", recv_counts)):
            if len(counts) != self.size or any(not isinstance(c, int) or c < 0 for c in counts):
                raise ConfigError(f"{name} must hold {self.size} whole numbers >= 0")
        item = send.itemsize
        check_pair(send, recv, sum(send_counts) * item, sum(recv_counts) * item)
        if send_counts[self.rank] != recv_counts[self.rank]:
            raise ConfigError("send_counts and recv_counts disagree on this rank's own block")

        def layout(counts: list[int]) -> tuple[list[int], list[int]]:
            offs, pos = [], 0
            for c in counts:
                offs.append(pos)
                pos += c * item
            return offs, [c * item for c in counts]

        so, sl = layout(send_counts)
        ro, rl = layout(recv_counts)
        return self._run("alltoallv", algorithm, ALLTOALL, Layout(send, recv, so, sl, ro, rl))

    def allgather(self, sendbuf: Any, recvbuf: Any, algorithm: str = "ring") -> Stats:
        """MPI_Allgather: every rank's sendbuf lands at block `rank` of every recvbuf."""
        send = as_buffer(sendbuf, "send buffer")
        recv = as_buffer(recvbuf, "receive buffer", writable=True)
        check_pair(send, recv, send.nbytes, send.nbytes * self.size)
        m = send.nbytes
        offs = [i * m for i in range(self.size)]
        return self._run("allgather", algorithm, ALLGATHER,
                         Layout(send, recv, [0] * self.size, [m] * self.size, offs, [m] * self.size))

    def barrier(self) -> None:
        self._check_open()
        self.control.barrier()

    # ---- point to point -------------------------------------------------------------
    def send(self, buf: Any, peer: int) -> None:
        """Two-sided send: waits until `peer` posted the matching recv, then writes into it."""
        self._check_open()
        peer = self._peer(peer)
        b = as_buffer(buf, "send buffer")
        n = self.p2p_sent.get(peer, 0)
        self.p2p_sent[peer] = n + 1
        tag = P2P_BIT | (n & 0x3FFFFFFF)
        addr, rkey, room = self.engine.wait_rtr(peer, tag, f"send #{n}")
        if room != b.nbytes:
            raise ConfigError(f"rank {peer} receives {room} bytes, this send has {b.nbytes}")
        mr = self._mr(b, remote=False)
        op = self.engine.write(peer, b.address, mr.lkey if mr else 0, b.nbytes, addr, rkey, tag)
        self.engine.wait_ops([op], f"send #{n}")

    def recv(self, buf: Any, peer: int) -> None:
        """Two-sided receive of exactly len(buf) bytes from `peer`, into buf in place."""
        self._check_open()
        peer = self._peer(peer)
        b = as_buffer(buf, "receive buffer", writable=True)
        n = self.p2p_recv.get(peer, 0)
        self.p2p_recv[peer] = n + 1
        tag = P2P_BIT | (n & 0x3FFFFFFF)
        mr = self._mr(b, remote=True)
        self.engine.send_ctrl(peer, RTR, tag, mr.rkey if mr else 0, b.address, b.nbytes)
        self.engine.wait_data(peer, tag, b.nbytes, f"recv #{n}")

    # ---- one-sided ------------------------------------------------------------------
    def expose(self, buf: Any, peer: int) -> None:
        """Let `peer` write into buf (it gets it with remote())."""
        self._check_open()
        peer = self._peer(peer)
        b = as_buffer(buf, "exposed buffer", writable=True)
        mr = self._mr(b, remote=True)
        n = self.exposed.get(peer, 0)
        self.exposed[peer] = n + 1
        self.engine.send_ctrl(peer, RTR, USER_BIT | (n & 0xFFFFFF), mr.rkey if mr else 0,
                              b.address, b.nbytes)

    def remote(self, peer: int) -> RemoteBuffer:
        """The next buffer `peer` exposed to us."""
        self._check_open()
        peer = self._peer(peer)
        n = self.remotes.get(peer, 0)
        self.remotes[peer] = n + 1
        addr, rkey, length = self.engine.wait_rtr(peer, USER_BIT | (n & 0xFFFFFF), "remote()")
        return RemoteBuffer(peer, addr, rkey, length)

    def write(self, buf: Any, target: RemoteBuffer, offset: int = 0, imm: int | None = None) -> None:
        """RDMA write of buf into target at offset; with imm, the target is notified
        (wait_imm) and imm (0..2^24-1) is the notice's value. Returns when acknowledged."""
        self._check_open()
        b = as_buffer(buf, "write buffer")
        if offset < 0 or offset + b.nbytes > target.length:
            raise ConfigError(f"{b.nbytes} bytes at offset {offset} do not fit the remote "
                              f"buffer of {target.length} bytes")
        if imm is not None and not 0 <= imm < 1 << 24:
            raise ConfigError(f"imm {imm} is outside 0..2^24-1")
        mr = self._mr(b, remote=False)
        tag = USER_BIT | (1 << 29) | (imm or 0)
        op = self.engine.write(target.peer, b.address, mr.lkey if mr else 0, b.nbytes,
                               target.addr + offset, target.rkey, tag, imm=imm is not None)
        self.engine.wait_ops([op], "write")

    def wait_imm(self, peer: int, imm: int, nbytes: int) -> None:
        """Wait for a write-with-immediate of nbytes from peer carrying imm."""
        self._check_open()
        self.engine.wait_data(self._peer(peer), USER_BIT | (1 << 29) | imm, nbytes, "write_imm")


def init(rank: int | None = None, world_size: int | None = None, master_addr: str | None = None,
         master_port: int | None = None, **options: Any) -> Communicator:
    """Start a communicator as torchrun, mpirun, srun or our launcher describe the job."""
    job = bootstrap.discover(rank, world_size, master_addr, master_port)
    return Communicator(job, **options)
