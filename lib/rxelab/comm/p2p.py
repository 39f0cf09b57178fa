"""Point to point and one-sided calls of a communicator (the seed's C API's send/recv, and
RDMA write into a buffer a peer exposed). Each is posted through the engine the collectives
use, under the same caller guard and failure handling (rxelab.comm.guard), with tags of its
own so it never meets a collective's messages."""

from __future__ import annotations

from typing import Any

from rxelab import checks
from rxelab.buffers import as_buffer
from rxelab.comm.core import Core
from rxelab.comm.guard import communicating
from rxelab.comm.results import RemoteBuffer
from rxelab.errors import ConfigError
from rxelab.messages import RTR

P2P_BIT = 1 << 31
USER_BIT = 1 << 30


class PointToPoint(Core):
    """The communicator's send/recv/expose/remote/write/wait_imm (a mixin: they are its
    methods, kept apart from the collectives)."""

    def send(self, buf: Any, peer: int) -> None:
        """Two-sided send: waits until `peer` posted the matching recv, then writes into it."""
        self._check_open()
        peer = self._peer(peer)
        b = as_buffer(buf, "send buffer")
        n = self.p2p_sent.get(peer, 0)
        tag = P2P_BIT | (n & 0x3FFFFFFF)
        with communicating(self, f"send #{n} to rank {peer}", tag):
            self.p2p_sent[peer] = n + 1
            addr, rkey, room = self.engine.wait_rtr(peer, tag, f"send #{n}")
            if room != b.nbytes:
                raise ConfigError(f"rank {peer} receives {room} bytes, this send has {b.nbytes}")
            mr = self._mr(b, remote=False)
            op = self.engine.write(peer, b.address, mr.lkey if mr else 0, b.nbytes, addr, rkey,
                                   tag)
            self.engine.wait_ops([op], f"send #{n}")

    def recv(self, buf: Any, peer: int) -> None:
        """Two-sided receive of exactly len(buf) bytes from `peer`, into buf in place."""
        self._check_open()
        peer = self._peer(peer)
        b = as_buffer(buf, "receive buffer", writable=True)
        n = self.p2p_recv.get(peer, 0)
        tag = P2P_BIT | (n & 0x3FFFFFFF)
        with communicating(self, f"recv #{n} from rank {peer}", tag):
            self.p2p_recv[peer] = n + 1
            mr = self._mr(b, remote=True)
            self.engine.send_ctrl(peer, RTR, tag, mr.rkey if mr else 0, b.address, b.nbytes)
            self.engine.wait_data(peer, tag, b.nbytes, f"recv #{n}")

    def expose(self, buf: Any, peer: int) -> None:
        """Let `peer` write into buf (it gets it with remote())."""
        self._check_open()
        peer = self._peer(peer)
        b = as_buffer(buf, "exposed buffer", writable=True)
        n = self.exposed.get(peer, 0)
        tag = USER_BIT | (n & 0xFFFFFF)
        with communicating(self, f"expose #{n} to rank {peer}", tag):
            self.exposed[peer] = n + 1
            mr = self._mr(b, remote=True, hold=True)  # the peer may write until we close
            self.engine.send_ctrl(peer, RTR, tag, mr.rkey if mr else 0, b.address, b.nbytes)

    def remote(self, peer: int) -> RemoteBuffer:
        """The next buffer `peer` exposed to us."""
        self._check_open()
        peer = self._peer(peer)
        n = self.remotes.get(peer, 0)
        tag = USER_BIT | (n & 0xFFFFFF)
        with communicating(self, f"remote #{n} of rank {peer}", tag):
            self.remotes[peer] = n + 1
            addr, rkey, length = self.engine.wait_rtr(peer, tag, "remote()")
        return RemoteBuffer(peer, addr, rkey, length)

    def write(self, buf: Any, target: RemoteBuffer, offset: int = 0,
              imm: int | None = None) -> None:
        """RDMA write of buf into target at offset; with imm, the target is notified
        (wait_imm) and imm (0..2^24-1) is the notice's value. Returns when acknowledged."""
        self._check_open()
        b = as_buffer(buf, "write buffer")
        offset = checks.whole(offset, "offset")
        if offset < 0 or offset + b.nbytes > target.length:
            raise ConfigError(f"{b.nbytes} bytes at offset {offset} do not fit the remote "
                              f"buffer of {target.length} bytes")
        tag = USER_BIT | (1 << 29) | (0 if imm is None else checks.immediate(imm))
        with communicating(self, f"write to rank {target.peer}", tag):
            mr = self._mr(b, remote=False)
            # no progress notices: the target may not be waiting (it polls in wait_imm only)
            op = self.engine.write(target.peer, b.address, mr.lkey if mr else 0, b.nbytes,
                                   target.addr + offset, target.rkey, tag, imm=imm is not None,
                                   notify=False)
            self.engine.wait_ops([op], "write")

    def wait_imm(self, peer: int, imm: int, nbytes: int) -> None:
        """Wait for a write-with-immediate of nbytes from peer carrying imm."""
        self._check_open()
        peer = self._peer(peer)
        tag = USER_BIT | (1 << 29) | checks.immediate(imm)
        nbytes = checks.nbytes(nbytes)
        with communicating(self, f"wait_imm from rank {peer}", tag):
            self.engine.wait_data(peer, tag, nbytes, "write_imm")
