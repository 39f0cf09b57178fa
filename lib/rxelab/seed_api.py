"""The seed's C API, one call each, so the seed's programs port line by line.
The seed: the C programs this project started from (an RDMA library and its test program).

    seed C                                  here
    rdma_init(&ctx, ...)                    ctx = rdma_init(rank, world_size, master_addr, port)
    rdma_connect_peer / rdma_accept_peer    rdma_connect_peer(ctx, peer) / rdma_accept_peer(ctx, peer)
    rdma_send(ctx, peer, buf, len)          rdma_send(ctx, peer, buf)
    rdma_recv(ctx, peer, buf, len)          rdma_recv(ctx, peer, buf)
    rdma_sequential_alltoall(ctx, s, r, n)  rdma_sequential_alltoall(ctx, send, recv)
    rdma_disconnect_peer(ctx, peer)         rdma_disconnect_peer(ctx, peer)
    rdma_cleanup(ctx)                       rdma_cleanup(ctx)

init() connects the full mesh at once, so connect/accept only check that the peer is there
and reachable (a zero-byte exchange), and disconnect marks it so later calls fail clearly.
"""

from __future__ import annotations

from typing import Any

from rxelab.comm import Communicator, Stats, init
from rxelab.errors import ConfigError


class SeedContext:
    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self.disconnected: set[int] = set()

    def peer(self, peer: int) -> int:
        if peer in self.disconnected:
            raise ConfigError(f"rank {peer} was disconnected (rdma_disconnect_peer)")
        return peer


def rdma_init(rank: int | None = None, world_size: int | None = None,
              master_addr: str | None = None, master_port: int | None = None,
              **options: Any) -> SeedContext:
    return SeedContext(init(rank, world_size, master_addr, master_port, **options))


def rdma_connect_peer(ctx: SeedContext, peer: int) -> None:
    """The active side of the seed's handshake: a zero-byte send the peer accepts."""
    ctx.comm.send(bytearray(0), ctx.peer(peer))


def rdma_accept_peer(ctx: SeedContext, peer: int) -> None:
    ctx.comm.recv(bytearray(0), ctx.peer(peer))


def rdma_send(ctx: SeedContext, peer: int, buf: Any) -> None:
    ctx.comm.send(buf, ctx.peer(peer))


def rdma_recv(ctx: SeedContext, peer: int, buf: Any) -> None:
    ctx.comm.recv(buf, ctx.peer(peer))


def rdma_sequential_alltoall(ctx: SeedContext, sendbuf: Any, recvbuf: Any) -> Stats:
    if ctx.disconnected:
        raise ConfigError(f"all-to-all needs every rank; disconnected: {sorted(ctx.disconnected)}")
    return ctx.comm.alltoall(sendbuf, recvbuf, algorithm="sequential")


def rdma_disconnect_peer(ctx: SeedContext, peer: int) -> None:
    ctx.disconnected.add(ctx.comm._peer(peer))


def rdma_cleanup(ctx: SeedContext) -> None:
    ctx.comm.close()
