"""Liveness a stranger cannot fake either way (issue 56, items 5 and 6), the stranger a process
of another local user (`nobody`, tests/unit/strangers.py), the ranks threads on the in-memory
fabric with the real control plane on 127.0.0.1:

- a squatter that takes a dead rank's port (rank 0's included) and accepts and closes every
  connection gives no proof: "unsure" ends, and the survivors shrink without the dead rank
  (before, every survivor's shrink failed: "ranks [2] are alive ... did not come", "rank 0 did
  not answer in time");
- a flood of plain connects on live ranks' listeners (probes then time out now and then) gets
  no live rank dropped from a shrink (before, one did in most trials): a stress test, which
  catches a regression only when the flood happens to time a probe out twice in a row;
  tests/unit/test_liveness_doubts.py pins the rules themselves on a clock of its own."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from rxelab.control.liveness import EVERY_S, NO_PROOF_S, PROBE_S

from tests.unit.fakejob import die, settle
from tests.unit.heldjob import run_held
from tests.unit.strangers import stranger_process, wait_for_word
from tests.unit.test_trust_fake import checked_sum, until_failure

pytestmark = pytest.mark.slow  # strangers' processes; probes waited out

SECRET = "5f0c2a9e7b1d4e6f8a3c5b7d9e1f2a4c6b8d0e2f4a6c8b0d2e4f6a8c0b2d4e6f"

# takes host:port once it is free (retrying the bind until then), then accepts and closes
# every connection at once: no handshake, no proof, nothing refused either
SQUATTER = """
import socket, sys, time
host, port, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
print("trying", flush=True)
end = time.monotonic() + wait
while True:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        break
    except OSError:
        s.close()
        if time.monotonic() > end:
            print("never free", flush=True)
            sys.exit(1)
        time.sleep(0.001)
s.listen(128)
print("bound", flush=True)
while True:
    conn, _ = s.accept()
    conn.close()
"""

# plain connects to each port in turn, as fast as it can, each held open until HOLD newer
# ones are: the listeners' accept queues stay full, so a probe's connect now and then times
# out (about one in eight); FLOODERS processes (the others end with the first)
FLOOD = """
import collections, os, socket, sys
host, procs, ports = sys.argv[1], int(sys.argv[2]), [int(p) for p in sys.argv[3:]]
hold = 1500
parent = os.getpid()
child = False
for _ in range(procs - 1):
    if os.fork() == 0:
        child = True
        break
held = collections.deque()
n = 0
while True:
    for port in ports:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, port))
        held.append(s)
        n += 1
        if len(held) > hold:
            held.popleft().close()
    if n == hold and not child:
        print("flooding", flush=True)
    if child and n % 512 == 0 and os.getppid() != parent:
        os._exit(0)
"""


FLOODERS = "2"  # processes: with four the flood can hold a listener for good
SHRINK_S = 60  # the shrinks' own deadline
# a squatter's port is found gone within NO_PROOF_S of its first unproven try, and a probe
# is due EVERY_S and ends within PROBE_S; three times that for a loaded host (and the build)
UNSURE_ENDS_S = 3 * (NO_PROOF_S + EVERY_S + PROBE_S)
assert UNSURE_ENDS_S < SHRINK_S, "a shrink that waited to its deadline would pass"


@pytest.fixture(autouse=True)
def secret(monkeypatch):
    monkeypatch.setenv("RXELAB_JOB_TOKEN", SECRET)


@pytest.mark.parametrize("victim", [2, 0], ids=["rank 2", "rank 0"])
def test_a_squatter_that_accepts_and_closes_on_a_dead_ranks_port_blocks_no_shrink(victim):
    squatted = threading.Event()
    with contextlib.ExitStack() as strangers:
        def job(comm):
            me = comm.rank
            settle(comm)
            if me == victim:
                port = comm.control.server.port
                squatter = strangers.enter_context(
                    stranger_process(SQUATTER, "127.0.0.1", str(port), "30"))
                said = bytearray()
                wait_for_word(squatter, "trying", 60, "the squatter to start", said)
                die(comm)
                wait_for_word(squatter, "bound", 30, "the squatter to take the dead rank's port",
                              said)
                squatted.set()
                return None
            until_failure(comm)
            assert squatted.wait(60), "the squatter never took the dead rank's port"
            started = time.monotonic()
            with comm.shrink(timeout=SHRINK_S) as new:
                return new.formed["lost"], checked_sum(new, me), time.monotonic() - started
        out = run_held(4, job, deadline=SHRINK_S + 60, keep_errors=False)
    total = sum(r + 1 for r in range(4) if r != victim)
    for r in range(4):
        if r == victim:
            continue
        lost, got, took = out[r]
        assert lost == [victim] and got == total, out
        assert took < UNSURE_ENDS_S, (
            f"the squatter held the shrink for {took:.1f} s: unsure did not end within "
            f"{UNSURE_ENDS_S:g} s (3 x (NO_PROOF_S + EVERY_S + PROBE_S))")


def flooded_shrink() -> list[object]:
    """A job of 4 where rank 3 dies while a stranger floods the listeners of rank 0 (which
    coordinates) and rank 1 with plain connects: what each rank's shrink gave."""
    flooding = threading.Event()
    with contextlib.ExitStack() as strangers:
        def job(comm):
            me = comm.rank
            settle(comm)
            if me == 0:
                ports = [str(comm.control.directory[r][1]) for r in (0, 1)]
                flood = strangers.enter_context(
                    stranger_process(FLOOD, "127.0.0.1", FLOODERS, *ports))
                wait_for_word(flood, "flooding", 60, "the flood to fill the listeners' queues")
                flooding.set()
            assert flooding.wait(90), "the flood never started"
            if me == 3:
                die(comm)
                return None
            until_failure(comm)
            with comm.shrink(timeout=40) as new:
                return new.formed["lost"], checked_sum(new, me)
        return run_held(4, job, deadline=150)


def test_a_connect_flood_on_live_listeners_gets_no_live_rank_dropped():
    """Every live rank is in the new communicator (the flood makes a probe's connect time out
    now and then: before, that counted the rank as gone). A stress test: one trial, each
    rank's wait bounded by the shrink's own deadline and the run's."""
    out = flooded_shrink()
    assert out[:3] == [([3], 6.0)] * 3, out
