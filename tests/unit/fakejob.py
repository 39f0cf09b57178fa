"""Runs a job of p ranks as threads on the in-memory fabric: each rank gets a Communicator
from rxelab.init (the real control plane on 127.0.0.1, the fake verbs underneath) and calls
fn(comm). Every rank's result or exception comes back; a rank still running after the
deadline is reported by name."""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import rxelab
from pyverbs import _fabric

# the transports the tests run the library over (RXELAB_TEST_TRANSPORTS=verbs,tcp,quic by default)
TRANSPORTS = tuple(t for t in os.environ.get("RXELAB_TEST_TRANSPORTS",
                                             "verbs,tcp,quic").split(",") if t)
SOCKETS = tuple(t for t in TRANSPORTS if t != "verbs")  # those on real sockets (loopback)
SOCKET_SIZES = (1, 2, 3, 5)  # world sizes a socket transport runs at: real threads and sockets
NO_AIOQUIC = pytest.mark.skipif(importlib.util.find_spec("aioquic") is None,
                                reason="transport quic needs aioquic (pip install 'rxelab[quic]')")


def transport_param(t: str, *values: Any, id: str | None = None) -> Any:
    """One parameter set of a transport's case: quic's skipped, in words, where there is no
    aioquic (the test extra installs it)."""
    return pytest.param(*values, t, id=id or t, marks=[NO_AIOQUIC] if t == "quic" else [])


def over_transports(sizes: Iterable[int]) -> Any:
    """parametrize("p, transport"): every size on the fake verbs, SOCKET_SIZES of them on the
    socket transports (what `make test` can afford)."""
    sizes = list(sizes)
    cases = [transport_param(t, p, id=f"{t}-{p}") for t in TRANSPORTS for p in sizes
             if t == "verbs" or p in SOCKET_SIZES]
    return pytest.mark.parametrize(("p", "transport"), cases)


def over(transports: Iterable[str]) -> Any:
    """parametrize("transport") over these transports."""
    return pytest.mark.parametrize("transport", [transport_param(t) for t in transports])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankFailed(Exception):
    def __init__(self, errors: dict[int, BaseException]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, e in sorted(errors.items())))


def run_ranks(p: int, fn: Callable[[Any], Any], *, deadline: float = 60, seed: int = 0,
              max_delay: float = 0.0002, keep_errors: bool = False,
              per_rank: Callable[[int], dict[str, Any]] | None = None,
              transport: str = "verbs", **options: Any) -> list[Any]:
    """transport: verbs runs on the in-memory fabric (device fake0); tcp and quic on loopback
    sockets."""
    if transport == "verbs":
        _fabric.FABRIC.reset(seed=seed, max_delay=max_delay)
        options.setdefault("device", "fake0")
    # rank 0's rendezvous listens before any rank starts: a port merely found free could be
    # taken meanwhile (by another test's transport, whose listeners take free ports too)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    options.setdefault("timeout", 20)

    def rank(r: int) -> Any:
        mine = {**options, "transport": transport, **(per_rank(r) if per_rank else {})}
        if r == 0:
            mine["_listener"] = listener
        with rxelab.init(r, p, "127.0.0.1", port, **mine) as comm:
            return fn(comm)
    try:
        return in_threads(p, rank, deadline, keep_errors)
    finally:
        listener.close()  # the communicator's, once it took it; ours if rank 0 never started


def in_threads(p: int, rank: Callable[[int], Any], deadline: float, keep_errors: bool) -> list[Any]:
    """rank(r) for r in 0..p-1, each on a thread of its own: every result or exception, in
    rank order; RankFailed if any raised (unless keep_errors), a named failure if any is still
    running after the deadline."""
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}

    def run(r: int) -> None:
        try:
            results[r] = rank(r)
        except BaseException as err:  # reported per rank
            errors[r] = err

    threads = [threading.Thread(target=run, args=(r,), daemon=True, name=f"rank{r}")
               for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline)
    hung = [t.name for t in threads if t.is_alive()]
    if hung:
        raise AssertionError(f"{', '.join(hung)} still running after {deadline} s")
    if errors and not keep_errors:
        raise RankFailed(errors)
    return [results.get(r, errors.get(r)) for r in range(p)]


_GATES: dict[tuple[int, int], threading.Barrier] = {}
_GATES_LOCK = threading.Lock()


def settle(comm: Any) -> None:
    """A barrier every rank has passed before any of them goes on (to die, say): the job's
    own barrier returns on a rank before rank 0's release reached the others, and a rank that
    dies at once can be gone before another's barrier returns. The ranks are threads of one
    process, so a threading barrier after the job's own one says they all passed it."""
    comm.barrier()
    # keyed by the job's port and size, and dropped once passed: the port is the system's pick,
    # and a later job of this process given the same port must not find an old gate (one of
    # another size never opens, one broken by a dead job fails at once)
    key = (comm.job.master_port, comm.size)
    with _GATES_LOCK:
        gate = _GATES.get(key)
        if gate is None or gate.broken:
            gate = _GATES[key] = threading.Barrier(comm.size)
    if gate.wait(30) == 0:
        with _GATES_LOCK:
            if _GATES.get(key) is gate:
                del _GATES[key]


def die(comm: Any) -> None:
    """This rank's process vanishes: sockets closed without a goodbye, QPs gone."""
    comm.control.stopping = True
    for link in [*comm.control.peers.values(), *([comm.control.root] if comm.control.root else [])]:
        link.close()
    for conn in comm.conns.values():
        if hasattr(conn, "kill"):  # a socket transport's: a reset, no goodbye
            conn.kill()
        else:
            conn.qp.close()
    if comm.control.server is not None:  # an elastic rank's listener goes with its process
        comm.control.server.close(listener=True)
    comm.closed = True
