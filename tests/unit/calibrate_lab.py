"""A lab made up for the calibration's tests: its figures are replays with costs chosen here,
so a fit must find those costs again (tests/unit/test_calibrate.py, test_calibrate_wake.py)."""

from __future__ import annotations

import copy
import functools

from rxelab import trace

from experiments.report import Record
from experiments.simulation import calibrate, replayer
from experiments.simulation.costs import Costs, Profile
from experiments.simulation.exchanges import CALLS

SIZES = [0, 1, 1024, 65536, 1 << 20]
LATENCY, BANDWIDTH, DUPLEX, LOOP = 300e-6, 30e6, 40e6, 60e6
NODE_CPUS, HOST_CPUS = 1, 2
# the made-up lab's truth: per message (both sides together) at each size, as flat from 64 KiB
# to 1 MiB as the lab's fits (the fit counts growth there as the bytes' CPU), and a byte's CPU
TRUTH = [(0, 400e-6), (1, 410e-6), (1024, 500e-6), (65536, 4e-3), (1 << 20, 4e-3)]
CALL, COPY, REDUCE, CPU_PER_BYTE = 150e-6, 2e-9, 6e-9, 10e-9
PING_PONG_SIZES = [1, 1024, 1 << 20]
PATH = 60e6  # each VM's data path: faster than perftest's both ways (DUPLEX), as the lab's was
WAKE = 700e-6  # CPU a blocked rank spends to run again, where the VMs outnumber the cores


def truth() -> Costs:
    return calibrate.costs(TRUTH, CALL, COPY, REDUCE)


def made_lab(host_cpus: int = HOST_CPUS) -> Profile:
    return Profile("truth", truth(), BANDWIDTH, LATENCY, NODE_CPUS, host_cpus, DUPLEX,
                   loop_bandwidth=LOOP, cpu_per_byte=CPU_PER_BYTE, path_bandwidth=PATH,
                   wake=WAKE)


@functools.cache  # a replay each: made once per process, the same every time
def lab(op: str, algorithm: str, p: int, size: int) -> float:
    return calibrate.replayed(op, algorithm, p, size, made_lab().lab(p), truth())


def record(op, algorithm, p, size, seconds, spread=0.05, busy=None, loaded=0):
    """Three rounds of a case as `fab run-experiment` keeps them: seconds per call (and the
    share of each node's CPUs busy, where given; the nodes loaded beside it, where any)."""
    return [{"app": "rxelab", "op": op, "algorithm": algorithm, "nodes": p, "size": size,
             "status": "ok", "netem": {}, "summary": {"tight": True, "ranks": p,
                                                     "avg_stage_us": seconds * f * 1e6,
                                                     **({"node_busy": [busy / f] * p}
                                                        if busy is not None else {})},
             **({"busy_neighbours": loaded, "busy_hosts": [f"node{p + 1 + i}" for i in
                                                           range(loaded)]} if loaded else {})}
            for f in (1 - spread, 1.0, 1 + spread)]


def beside(size: int, loaded: int, host_cpus: int = HOST_CPUS) -> list[dict]:
    """The 2-rank exchange beside `loaded` nodes each running a CPU loop, as the made-up lab
    runs it (the machine's cores outnumbered: each blocked rank spends WAKE's share to run again).
    Replayed once per process; each caller gets records of its own to change."""
    return copy.deepcopy(_beside(size, loaded, host_cpus))


@functools.cache
def _beside(size: int, loaded: int, host_cpus: int) -> list[dict]:
    t = trace.record("alltoall", "pairwise", 2, size, calls=CALLS)
    seconds = replayer.replay(t, made_lab(host_cpus).lab(2 + loaded), truth(),
                              busy=loaded).seconds / CALLS
    return record("alltoall", "pairwise", 2, size, seconds, loaded=loaded)


def exchange(size: int) -> list[dict]:
    """The 2-rank exchange as the made-up lab runs it: its time, and each node's CPU busy
    with its call, its own block's copy, its messages' costs and their bytes both ways."""
    seconds = lab("alltoall", "pairwise", 2, size)
    cpu = CALL + COPY * size + truth().send_cpu(size) + truth().recv_cpu(size) \
        + 2 * size * CPU_PER_BYTE
    return record("alltoall", "pairwise", 2, size, seconds, busy=cpu / seconds / NODE_CPUS)


def link(tool, size, value, nodes=2):
    key = "lat_us" if tool == "ib_send_lat" else "bw_MBps"
    return [{"app": "perftest", "algorithm": tool, "size": size, "status": "ok", "nodes": nodes,
             "summary": {key: value}}] * 3


def typed(run: list[dict]) -> list[Record]:
    """The records as the runner's records.jsonl gives them to fit() and measurements()."""
    return [Record.model_validate(r) for r in run]


def made_up_run() -> list[dict]:
    """The calibrate spec's figures on the made-up lab. Its replays take seconds, so it is made
    once per process; each caller gets records of its own to change."""
    return copy.deepcopy(_made_up_run())


@functools.cache
def _made_up_run() -> list[dict]:
    out = record("alltoall", "pairwise", 1, 0, CALL)
    out += record("alltoall", "pairwise", 1, 1 << 20, CALL + COPY * (1 << 20))
    for s in SIZES:
        out += exchange(s)
    out += record("allreduce", "ring", 2, 1 << 20, lab("allreduce", "ring", 2, 1 << 20))
    for s in PING_PONG_SIZES:
        out += record(*calibrate.PING_PONG, 2, s, lab(*calibrate.PING_PONG, 2, s))
    out += link("ib_send_lat", 1, LATENCY * 1e6) + link("ib_write_bw", 1 << 20, BANDWIDTH / 1e6)
    out += link("ib_write_bw_bidir", 1 << 20, DUPLEX / 1e6)
    out += link("ib_write_bw", 1 << 20, LOOP / 1e6, nodes=1)
    out += beside(1024, 1)
    return out
