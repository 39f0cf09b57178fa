"""The one link a report holds collectives against, the same in its plots and its tables: the
rate rxe carried one way between two nodes (perftest's one-way `ib_write_bw`), which no traffic
over rxe outruns in one direction. A collective's busbw (nccl-tests' bus bandwidth) is the bytes
each rank sends, and receives, per second for its collective, each direction's load, so it is
measured against one direction of the link. Traffic that does not cross rxe (Open MPI's TCP,
Gloo, rxelab over tcp or quic: the kernel's TCP stack on the same NIC) gets no share of it: rxe's
rate is not what bounds them."""

from __future__ import annotations

from dataclasses import dataclass

from rxelab import perftest

from experiments.report.view import Row
from experiments.running.records import Record
from experiments.spec import Case

TOOL = "ib_write_bw"  # one direction alone: the link's rate
NAME = f"one-way {TOOL}"  # how plots and tables name it
NOT_OVER_RXE = "not over rxe"  # the "% of link" of a row whose bytes rxe did not carry


@dataclass(frozen=True)
class Link:
    """The link's rate in a run (MB/s, None where the run did not measure it) and what the
    report says of it."""

    rate_MBps: float | None
    both_MBps: float | None = None  # `ib_write_bw -b`: both directions at once, their sum

    @property
    def label(self) -> str:
        """The plots' name of the line, with its rate."""
        return f"link: {NAME} ({self.rate_MBps:.1f} MB/s)" if self.rate_MBps else ""

    @property
    def note(self) -> str:
        """What "% of link" divides by and why, in the report's words; "" where no rate."""
        if not self.rate_MBps:
            return (f"% of link: none, as the run did not measure {NAME} between two nodes "
                    "(the link's rate).") if self.both_MBps else ""
        out = (f"% of link: busbw over the link's rate, {NAME} between two nodes "
               f"({self.rate_MBps:.1f} MB/s, the best the run measured): the line of the busbw "
               "plots. busbw (nccl-tests') is the bytes each rank sends, and receives, per second "
               "for its collective: algbw x (n-1)/n for alltoall, allgather and reduce_scatter, "
               "x 2(n-1)/n for allreduce, x 1 for bcast; so it is one direction's load, set "
               "against the most rxe carried in one direction, which traffic over rxe does not "
               "outrun: a share of 100 % is the link full.")
        if self.both_MBps:
            each = self.both_MBps / 2
            out += (f" Both directions at once ({perftest.command(perftest.BIDIR)}) rxe carried "
                    f"{self.both_MBps:.1f} MB/s together, {each:.1f} each way "
                    f"({100 * each / self.rate_MBps:.0f} % of link): rxe spends the CPU of both "
                    "ends on every byte, so a collective, which sends and receives at once, can "
                    "expect about that much.")
        return out + (f" Rows over TCP (MPI over TCP, Gloo, rxelab over tcp or quic) say "
                      f"\"{NOT_OVER_RXE}\" and their busbw plots' series too: the kernel's TCP "
                      "stack carries them over the same NIC without rxe's cost per packet, so "
                      "rxe's rate does not bound them and a share of it would not say how full "
                      "their path was. Ranks sharing a node share its link: no share either.")


def rate(records: list[Record], tool: str = TOOL) -> float | None:
    """The tool's best between two nodes in this run (MB/s); a pair on one node is rxe's
    loopback, not the link."""
    limit = [bw for r in records
             if r.app == "perftest" and r.algorithm == tool and r.nodes != 1
             and (bw := r.summary and r.summary.bw_MBps)]
    return max(limit) if limit else None


def measured(records: list[Record]) -> Link:
    return Link(rate(records), rate(records, perftest.BIDIR))


def over_rxe(case: Case) -> bool:
    """Whether rxe carried a case's bytes: rxelab over verbs (its variants too, and the hand
    loop) and Open MPI over UCX; not Open MPI over TCP, Gloo, or rxelab over tcp or quic. An
    rxelab record's `transport` is not the library's (records before it had transports say
    tcp there of runs over verbs)."""
    if case.app == "rxelab":
        return case.rxelab_transport in (None, "verbs")
    return case.app == "mpi" and case.transport == "ucx"


def share(flat: list[Row], link: Link) -> None:
    """Each row's "% of link": its busbw over the link's rate, where rxe carried it and each
    node ran one rank (ranks sharing a node share its link); a row rxe did not carry says so."""
    for r in flat:
        alone = r.ranks == r.nodes
        r.link_pct = (100 * r.busbw / link.rate_MBps
                      if link.rate_MBps and alone and r.over_rxe and r.busbw else None)
        r.link_note = NOT_OVER_RXE if link.rate_MBps and not r.over_rxe else ""
