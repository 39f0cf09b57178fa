"""What a listener spends on connections that proved nothing yet has an end
(rxelab.control.accepting, rxelab.control.accept_limits): a connection's patience is not
renewed by a byte that finishes no frame; nothing it sends ahead while its frame waits for a
check is buffered; a full gate makes a knock wait its turn, a full room leaves newcomers in the
backlog (a prober times out: busy), where both closed them unanswered (to liveness: a
stranger); a closed gate leaves no checker or munge process behind; a flood from elsewhere is
refused by its rate before the kernel is asked who sent it.

The acceptor is driven by hand (hear), on 127.0.0.1 with ports the kernel chose. Each `_pump`
waits for an event the test names; its deadline only ends a test that fails."""

from __future__ import annotations

import fcntl
import os
import select
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rxelab.control import accept_limits, accepting, framing, handshake
from rxelab.control.accepting import Acceptor
from rxelab.control.handshake import SharedSecret

SECRET = "JPrm-WjSNOqrWZ8HLGJnVaT8PRpWOIiXYT9TxA0tIKI"
LIB = Path(__file__).resolve().parents[2] / "lib"
FAILSAFE_S = 20.0  # a pump that waits longer has failed
SIOCOUTQNSD = 0x894B  # bytes a socket has not sent yet (linux/sockios.h)
real_clock = time.monotonic  # the failsafe's, whatever clock a test gives the acceptor


class Costly:
    """A credential that costs, as MUNGE does (its steps run on the gate's checkers), and
    whose listener proof waits until the test lets it go (`go`), saying when it began."""

    costly, same_user_only, secured, source = True, False, True, "test"

    def __init__(self) -> None:
        self.inner = SharedSecret.of(SECRET, "test")
        self.go, self.working = threading.Event(), threading.Event()
        self.go.set()

    def handshake(self) -> Costly:
        return self

    def prove(self, role: bytes, transcript: bytes) -> str:
        self.working.set()
        assert self.go.wait(FAILSAFE_S)
        return self.inner.prove(role, transcript)

    def check(self, role: bytes, transcript: bytes, proof: str) -> bool:
        return self.inner.check(role, transcript, proof)

    def seal_key(self, transcript: bytes) -> bytes:
        return self.inner.seal_key(transcript)


@pytest.fixture
def room() -> Iterator[Callable[..., Acceptor]]:
    """Acceptors on listeners of their own; every socket and acceptor closed at the end."""
    made: list[tuple[Acceptor, socket.socket]] = []

    def open_acceptor(credential: Any, *, patience: float = 5.0, limit: int = 8) -> Acceptor:
        listener = socket.create_server(("127.0.0.1", 0))
        h = Acceptor(listener, credential, lambda knock: None, patience=patience, limit=limit)
        made.append((h, listener))
        return h
    yield open_acceptor
    for h, listener in made:
        if isinstance(h.credential, Costly):
            h.credential.go.set()
        h.close()
        listener.close()


def _dial(h: Acceptor) -> socket.socket:
    return socket.create_connection(h.listener.getsockname()[:2], timeout=FAILSAFE_S)


def _knock() -> bytes:
    return framing.encode({"type": "knock", "kind": "probe", "rank": 0, "to": 1, "generation": 0,
                        "scope": "job", "nonce": handshake.nonce()})


def _pump(h: Acceptor, until: Callable[[], bool]) -> None:
    deadline = real_clock() + FAILSAFE_S
    while not until():
        assert real_clock() < deadline, f"waited {FAILSAFE_S:g} s in vain; {h.dropped}"
        h.hear(0.02)


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def _queued(sock: socket.socket, request: int) -> int:
    """Bytes in a socket's queue in the kernel: not read yet (FIONREAD), not sent yet."""
    return int.from_bytes(fcntl.ioctl(sock, request, bytes(4)), "little")


def _challenged(client: socket.socket) -> bool:
    try:
        return framing.recv(client, deadline=time.monotonic() + 5, peer="acceptor")["type"] == "challenge"
    except Exception as err:
        pytest.fail(f"a knock was not answered: {type(err).__name__}: {err}")


def test_a_byte_that_finishes_no_frame_does_not_renew_a_connections_patience(room, monkeypatch):
    """One byte of a knock every 0.7 s, at a patience of 1 s: dropped at the third, on the
    test's clock (before, each byte's check renewed the patience: pending for ever)."""
    now = [1000.0]
    monkeypatch.setattr(accepting.time, "monotonic", lambda: now[0])
    h = room(Costly(), patience=1.0)
    client = _dial(h)
    _pump(h, lambda: len(h.pending) == 1)
    knock = _knock()
    for i in range(4):
        client.send(knock[i:i + 1])
        _pump(h, lambda i=i: not h.pending or len(next(iter(h.pending.values()))[0]) == i + 1)
        if not h.pending:
            break
        now[0] += 0.7
    assert not h.pending, "a connection that sends a byte every 0.7 s is still waiting"
    assert any("did not finish the handshake within 1 s" in d for d in h.dropped), h.dropped
    assert i == 2, f"dropped at byte {i + 1}, not the third"


def test_what_comes_while_a_frame_is_checked_stays_in_the_kernel(room):
    """While a knock's check runs, the connection's flood is not read: the acceptor took its
    knock and nothing more (before, all of it, in memory: 535 MiB in a repro)."""
    cred = Costly()
    cred.go.clear()
    h = room(cred)
    client = _dial(h)
    knock = _knock()
    client.sendall(knock)
    _pump(h, cred.working.is_set)
    server = next(iter(h.pending))
    client.setblocking(False)
    sent, junk = len(knock), bytes(1 << 16)
    while sent < 16 << 20:
        try:
            sent += client.send(junk)
        except BlockingIOError:
            break
    for _ in range(5):  # what is there is in the kernel already: a reading acceptor takes it now
        h.hear(0)
    taken = sent - _queued(client, SIOCOUTQNSD) - _queued(server, termios.FIONREAD)
    assert taken <= len(knock) + framing.HEADER.size + framing.HANDSHAKE_BODY, \
        f"the acceptor read {taken} bytes of a connection whose knock was still being checked"
    cred.go.set()
    _pump(h, lambda: server not in h.pending)
    assert "not an rxelab message" in h.dropped[-1], h.dropped


def test_a_newcomer_the_gate_refuses_costs_no_waiting_connection_its_place(room):
    h = room(SharedSecret.of(SECRET, "test"), limit=1)
    waiting = _dial(h)
    _pump(h, lambda: len(h.pending) == 1)
    first = next(iter(h.pending))
    h.gate.admit = lambda sock: "refused by the test's gate"  # type: ignore[method-assign]
    refused = _dial(h)
    _pump(h, lambda: any("refused by the test's gate" in d for d in h.dropped))
    assert first in h.pending, f"the waiting connection went for a refused one: {h.dropped}"
    assert not any("crowded out" in d for d in h.dropped), h.dropped
    waiting.close()
    refused.close()


def test_a_full_room_leaves_a_newcomer_in_the_backlog_and_evicts_no_check(room):
    """Room for one, whose knock a checker holds: a probe that comes meanwhile waits, and is
    answered once the first has gone (before, the first went mid-check, for the probe)."""
    cred = Costly()
    cred.go.clear()
    h = room(cred, limit=1)
    first = _dial(h)
    first.sendall(_knock())
    _pump(h, cred.working.is_set)
    held = next(iter(h.pending))
    prober = _dial(h)  # the kernel took it: it is in the listener's backlog
    prober.sendall(_knock())
    for _ in range(5):  # the listener is readable now: a acceptor that takes it does so now
        h.hear(0)
    assert list(h.pending) == [held], f"a connection mid-check went: {h.dropped}"
    cred.go.set()
    _pump(h, lambda: _readable(first))
    assert _challenged(first)
    first.close()
    _pump(h, lambda: _readable(prober))
    assert _challenged(prober)
    assert not any("crowded out" in d for d in h.dropped), h.dropped


def test_a_full_gate_makes_a_knock_wait_its_turn_not_closes_it(room, monkeypatch):
    monkeypatch.setattr(accept_limits, "MAX_WAITING", 1)
    cred = Costly()
    cred.go.clear()
    h = room(cred)
    first, second = _dial(h), _dial(h)
    _pump(h, lambda: len(h.pending) == 2)
    first.sendall(_knock())
    _pump(h, cred.working.is_set)
    second.sendall(_knock())
    _pump(h, lambda: len(h.pending) < 2 or all(
        _queued(s, termios.FIONREAD) == 0 for s in h.pending))  # both knocks read
    cred.go.set()
    for client in (first, second):
        _pump(h, lambda client=client: _readable(client))
        assert _challenged(client)
    assert not any("too many handshakes" in d for d in h.dropped), h.dropped


def test_closing_a_gate_kills_the_process_a_checker_waits_for():
    g = accept_limits.Gate(Costly())
    started: list[subprocess.Popen[bytes]] = []
    checkers: list[threading.Thread] = []
    running = threading.Event()

    def work() -> int:
        proc = subprocess.Popen(["sleep", "60"])
        started.append(proc)
        checkers.append(threading.current_thread())
        running.set()
        return proc.wait()
    g.submit(work, lambda future: None)
    assert running.wait(FAILSAFE_S)
    try:
        g.close()
        assert started[0].wait(timeout=10) < 0, "the munge a checker waited for still runs"
        checkers[0].join(timeout=10)
        assert not checkers[0].is_alive(), "the checker outlived its gate"
    finally:
        if started[0].poll() is None:
            started[0].kill()


def test_a_munge_a_checker_starts_as_its_gate_closes_is_killed(monkeypatch):
    """The checker starts its munge only once close() looked for its processes (and found
    none): it is killed all the same, and the checker ends (before, close() looked once, and
    that munge outlived the gate)."""
    monkeypatch.setattr(accept_limits, "CLOSE_S", FAILSAFE_S)  # close() ends as its checkers do
    looked, running = threading.Event(), threading.Event()
    started: list[subprocess.Popen[bytes]] = []
    look = accept_limits._kill_children

    def look_and_say(thread: threading.Thread) -> None:
        look(thread)
        looked.set()
    monkeypatch.setattr(accept_limits, "_kill_children", look_and_say)

    def work() -> int:
        running.set()
        assert looked.wait(FAILSAFE_S), "close() never looked for the checker's processes"
        proc = subprocess.Popen(["sleep", "60"])
        started.append(proc)
        return proc.wait()
    g = accept_limits.Gate(Costly())
    g.submit(work, lambda future: None)
    assert running.wait(FAILSAFE_S)
    g.close()
    try:
        assert started, "the check never started its munge"
        try:
            code = started[0].wait(timeout=FAILSAFE_S)
        except subprocess.TimeoutExpired:
            pytest.fail("a munge started as the gate closed still runs after close()")
        assert code < 0, code
        assert not any(c.is_alive() for c in g._checkers), "a checker outlived its gate"
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_submit_under_way_as_the_gate_closes_leaves_no_checker(monkeypatch):
    """submit() passed its look at whether the gate is closed and is about to start a checker
    when close() is called: once both returned no checker is left (before, close() did not
    wait, and the checker it started afterwards waited for work for ever); a submit after
    close() starts none and hears at once that it was cancelled."""
    hold_s = 1.0  # the paused submit waits this long for close(): an unguarded close ends in
    # microseconds, a guarded one waits for the submit (the outcome does not hang on it)
    paused, closed = threading.Event(), threading.Event()
    real_thread = threading.Thread

    class Paused(real_thread):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if str(kwargs.get("name", "")).startswith("rxelab-check"):
                paused.set()
                closed.wait(hold_s)
            super().__init__(*args, **kwargs)

    g = accept_limits.Gate(Costly())
    heard: list[Any] = []
    submitter = real_thread(target=g.submit, args=(lambda: None, heard.append), daemon=True)
    monkeypatch.setattr(accept_limits.threading, "Thread", Paused)
    submitter.start()
    assert paused.wait(FAILSAFE_S), "submit() never started a checker"
    g.close()
    closed.set()
    submitter.join(FAILSAFE_S)
    monkeypatch.undo()
    assert not submitter.is_alive()
    for checker in g._checkers:
        checker.join(FAILSAFE_S / 4)  # an unguarded gate's checker: this only ends in vain
    assert not any(c.is_alive() for c in g._checkers), "a checker outlived its gate"
    assert len(heard) == 1 and heard[0].done(), heard  # ran before close() took over, or cancelled
    before = len(g._checkers)
    g.submit(lambda: pytest.fail("work ran on a closed gate"), heard.append)
    assert len(g._checkers) == before and heard[1].cancelled(), "a closed gate took work"


def test_a_check_still_running_does_not_hold_up_the_interpreters_exit():
    script = (
        "import threading, time\n"
        "from rxelab.control import accept_limits\n"
        "class C: costly = True\n"
        "g, began = accept_limits.Gate(C()), threading.Event()\n"
        "g.submit(lambda: (began.set(), time.sleep(60)), lambda f: None)\n"
        "began.wait()\n"
        "g.close()\n"
        "print('closed', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(LIB)})
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the interpreter waited at exit for a check of a closed gate")
    assert out.strip() == b"closed" and proc.returncode == 0, (out, proc.returncode)


class _Peer:
    """A connection as the gate sees it: its two ends' addresses."""

    def __init__(self, address: str) -> None:
        self.address = address

    def getpeername(self) -> tuple[str, int]:
        return (self.address, 40000)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 5000)


def test_a_flood_from_elsewhere_is_refused_by_its_rate_before_the_kernel_is_asked(monkeypatch):
    asked: list[str] = []
    monkeypatch.setattr(accept_limits, "peer_uid", lambda sock: asked.append(sock.address) or (
        4321 if sock.address == "127.0.0.1" else None))  # another user's, here
    monkeypatch.setattr(accept_limits.time, "monotonic", lambda: 100.0)  # no token comes back meanwhile
    g = accept_limits.Gate(Costly())
    g.same_user_only = True

    def admit(address: str) -> str:
        return g.admit(_Peer(address)) or "admitted"  # type: ignore[arg-type]
    said = [admit("192.0.2.7") for _ in range(accept_limits.BURST + 10)]
    assert said[:accept_limits.BURST] == ["admitted"] * accept_limits.BURST
    assert all("connections a second from 192.0.2.7" in s for s in said[accept_limits.BURST:]), said
    assert asked == [], f"sock_diag asked {len(asked)} times about a peer on another host"
    assert "another user (uid 4321)" in admit("127.0.0.1"), "a peer here is named by the kernel"
    assert asked == ["127.0.0.1"]
