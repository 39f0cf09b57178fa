"""The shipped collectives by name, as MPI spells them (comm.alltoall(s, r),
comm.iallreduce(x, x)): each is one line onto Communicator.collective() or start() with its
description's arguments (rxelab.ops.COLLECTIVES), spelt out so that type checkers and help()
see them. tests/unit/test_named_methods.py holds every description to its two methods."""

from __future__ import annotations

from typing import Any

from rxelab.comm.core import Core
from rxelab.comm.results import Stats
from rxelab.requests import Request


class NamedCollectives(Core):
    """A mixin of the communicator: every method is one line onto its generic paths."""

    def alltoall(self, sendbuf: Any, recvbuf: Any, algorithm: str | None = None,
                 pairs: int = 1, compression: str | None = None) -> Stats:
        """MPI_Alltoall: block j of sendbuf goes to rank j; block i of recvbuf comes from rank i.
        (algorithm=None, here and below: the default its description names.)
        With algorithm="sequential", `pairs` pairs at most exchange at once (1: strictly
        sequential; p(p-1)/2: all at once), in the same fixed order.
        compression, here and below: how this call's rendezvous blocks travel (rxelab.codecs;
        None: the communicator's choice)."""
        return self.collective("alltoall", sendbuf, recvbuf, algorithm, pairs=pairs,
                               compression=compression)

    def allgather(self, sendbuf: Any, recvbuf: Any, algorithm: str | None = None,
                  pairs: int = 1, compression: str | None = None) -> Stats:
        """MPI_Allgather: every rank's sendbuf lands at block `rank` of every recvbuf (pairs:
        as in alltoall, for algorithm="sequential")."""
        return self.collective("allgather", sendbuf, recvbuf, algorithm, pairs=pairs,
                               compression=compression)

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: str = "sum",
                  algorithm: str | None = None, compression: str | None = None) -> Stats:
        """MPI_Allreduce: recvbuf = op over every rank's sendbuf, element by element (sum, prod,
        min, max on numpy integer and float arrays). allreduce(x, x) works in place."""
        return self.collective("allreduce", sendbuf, recvbuf, algorithm, op=op,
                               compression=compression)

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, op: str = "sum",
                       algorithm: str | None = None, compression: str | None = None) -> Stats:
        """MPI_Reduce_scatter_block: block r (len(recvbuf) elements) of op over every rank's
        sendbuf (size * len(recvbuf) elements) lands at rank r."""
        return self.collective("reduce_scatter", sendbuf, recvbuf, algorithm, op=op,
                               compression=compression)

    def bcast(self, buf: Any, root: int = 0, algorithm: str | None = None,
              compression: str | None = None) -> Stats:
        """MPI_Bcast: root's buf lands in every rank's buf (same size everywhere)."""
        return self.collective("bcast", buf, None, algorithm, root=root, compression=compression)

    def alltoallv(self, sendbuf: Any, send_counts: list[int], recvbuf: Any,
                  recv_counts: list[int], algorithm: str | None = None, pairs: int = 1,
                  compression: str | None = None) -> Stats:
        """MPI_Alltoallv with contiguous blocks: counts are in elements of the buffers; the
        algorithms are alltoall's."""
        return self.collective("alltoallv", sendbuf, recvbuf, algorithm, pairs=pairs,
                               send_counts=send_counts, recv_counts=recv_counts,
                               compression=compression)

    # ---- nonblocking: each returns a Request at once (req.test(), req.wait()) ----------
    def ialltoall(self, sendbuf: Any, recvbuf: Any, algorithm: str | None = None,
                  pairs: int = 1, compression: str | None = None) -> Request:
        """alltoall, started."""
        return self.start("alltoall", sendbuf, recvbuf, algorithm, pairs=pairs,
                          compression=compression)

    def ialltoallv(self, sendbuf: Any, send_counts: list[int], recvbuf: Any,
                   recv_counts: list[int], algorithm: str | None = None, pairs: int = 1,
                   compression: str | None = None) -> Request:
        return self.start("alltoallv", sendbuf, recvbuf, algorithm, pairs=pairs,
                          send_counts=send_counts, recv_counts=recv_counts, compression=compression)

    def iallgather(self, sendbuf: Any, recvbuf: Any, algorithm: str | None = None,
                   pairs: int = 1, compression: str | None = None) -> Request:
        return self.start("allgather", sendbuf, recvbuf, algorithm, pairs=pairs,
                          compression=compression)

    def iallreduce(self, sendbuf: Any, recvbuf: Any, op: str = "sum",
                   algorithm: str | None = None, compression: str | None = None) -> Request:
        return self.start("allreduce", sendbuf, recvbuf, algorithm, op=op, compression=compression)

    def ireduce_scatter(self, sendbuf: Any, recvbuf: Any, op: str = "sum",
                        algorithm: str | None = None, compression: str | None = None) -> Request:
        return self.start("reduce_scatter", sendbuf, recvbuf, algorithm, op=op,
                          compression=compression)

    def ibcast(self, buf: Any, root: int = 0, algorithm: str | None = None,
               compression: str | None = None) -> Request:
        return self.start("bcast", buf, None, algorithm, root=root, compression=compression)
