"""The rules of rxelab.control.liveness on a clock of the test's (no sleeping, no network, no luck):
what one failed dial says (verdict_of); "unsure" has an end (no proof for NO_PROOF_S over
STRIKES tries: gone); a connect that times out towards a rank its heartbeats vouch for is no
death; and that vouching lapses SILENT_S after the rank was last heard (rxelab.control.plane's own
silence rule), so a node that stopped or powered off as a shrink began is dropped, never
waited for to the shrink's deadline (before, it was vouched for as long as the shrink ran)."""

from __future__ import annotations

import copy
import errno
import threading

import pytest
from rxelab import bootstrap
from rxelab.control import plane
from rxelab.control.liveness import (
    EVERY_S,
    NO_PROOF_S,
    SILENT_S,
    STRIKES,
    Doubts,
    Lively,
    Verdict,
    Watch,
    verdict_of,
)
from rxelab.errors import AuthError, PeerError, ProtocolError, Reason

T0 = 1000.0  # the test's clock starts here


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("err, verdict", [
    (ConnectionRefusedError(), Verdict.GONE),
    (AuthError("a stranger on the port"), Verdict.GONE),
    (PeerError("said nothing", reason=Reason.SILENT), Verdict.MUTE),
    (PeerError("closed mid-handshake", reason=Reason.DIED), Verdict.UNSURE),
    (ConnectionResetError(), Verdict.UNSURE),
    (BrokenPipeError(), Verdict.UNSURE),
    (ProtocolError("not a challenge"), Verdict.UNSURE),
    (TimeoutError("timed out"), Verdict.UNANSWERED),  # socket.create_connection's
    (OSError(errno.EHOSTUNREACH, "no route to host"), Verdict.UNANSWERED),
], ids=lambda x: type(x).__name__ if isinstance(x, BaseException) else x)
def test_what_one_failed_dial_says(err, verdict):
    assert verdict_of(err) == verdict


@pytest.mark.parametrize("verdict", [Verdict.UNSURE, Verdict.MUTE, Verdict.UNANSWERED])
def test_unsure_has_an_end_no_proof_for_no_proof_s_over_strikes_tries_is_gone(verdict):
    clock = Clock()
    doubts = Doubts((), clock)
    doubts.note(1, verdict, T0)
    clock.now = T0 + 10 * NO_PROOF_S
    assert not doubts.gone(1), "one try is not enough, however long ago"
    for i in range(1, STRIKES):
        doubts.note(1, verdict, T0 + i)
    clock.now = T0 + NO_PROOF_S - 0.01
    assert not doubts.gone(1), f"{STRIKES} tries, but not yet {NO_PROOF_S:g} s without proof"
    clock.now = T0 + NO_PROOF_S
    assert doubts.gone(1) and not doubts.alive(1)


def test_a_proof_starts_the_doubt_over_and_a_refusal_is_death_at_once():
    clock = Clock()
    doubts = Doubts((), clock)
    doubts.note(1, Verdict.UNSURE, T0)
    doubts.note(1, Verdict.ALIVE, T0 + 1)
    for i in range(STRIKES):
        doubts.note(1, Verdict.UNSURE, T0 + 2 + i)
    clock.now = T0 + NO_PROOF_S + 1
    assert not doubts.gone(1) and doubts.alive(1), "proven a second in: its doubt starts then"
    clock.now = T0 + NO_PROOF_S + 2
    assert doubts.gone(1)
    doubts.note(2, Verdict.GONE, T0)
    assert doubts.gone(2)
    doubts.forget(2)  # it came after all
    assert not doubts.gone(2) and doubts.alive(2)


@pytest.mark.parametrize("verdict", [Verdict.UNANSWERED, Verdict.MUTE])
def test_a_timeout_on_a_rank_its_heartbeats_vouch_for_is_no_death_until_they_lapse(verdict):
    """Rank 1 was last heard at T0 (its heartbeats vouch for it to T0 + SILENT_S); rank 2 is
    vouched for by nobody. Both time out on every try."""
    clock = Clock()
    doubts = Doubts(Lively({1: T0 + SILENT_S}), clock)
    tries = [T0 + k * EVERY_S for k in range(int(SILENT_S / EVERY_S) + STRIKES)]
    for began in tries:
        clock.now = began
        for r in (1, 2):
            doubts.note(r, verdict, began)
        if began < T0 + SILENT_S:
            assert not doubts.gone(1) and doubts.alive(1), f"{began - T0:g} s in"
        assert doubts.gone(2) == (began - T0 >= NO_PROOF_S), f"{began - T0:g} s in"
    clock.now = T0 + SILENT_S
    assert not doubts.gone(1), "vouched for up to SILENT_S after it was last heard"
    clock.now = T0 + SILENT_S + 0.01
    assert doubts.gone(1) and not doubts.alive(1), "its heartbeats lapsed: a stopped node"


def test_vouching_never_covers_a_listener_that_took_a_connection_and_closed_it_unproven():
    clock = Clock()
    doubts = Doubts(Lively({1: T0 + SILENT_S}), clock)
    doubts.note(1, Verdict.UNANSWERED, T0)
    doubts.note(1, Verdict.UNSURE, T0 + 1)  # taken and closed: no flood does that, a squatter does
    clock.now = T0 + NO_PROOF_S
    assert doubts.gone(1)


def test_ranks_given_without_times_were_heard_just_now():
    """forming's watch of a shrink's members: they proved themselves in the agreement."""
    clock = Clock()
    doubts = Doubts(range(3), clock)
    for k in range(STRIKES):
        doubts.note(1, Verdict.UNANSWERED, T0 + k)
    clock.now = T0 + SILENT_S
    assert not doubts.gone(1) and doubts.alive(2), "vouched for SILENT_S from the start"
    clock.now = T0 + SILENT_S + 0.01
    assert doubts.gone(1) and not doubts.alive(2) and not doubts.alive(7)


def test_the_control_plane_vouches_for_each_rank_from_when_it_was_last_heard(monkeypatch):
    """lively(): each rank until SILENT_S (the control plane's, as set) after it was last
    heard; one that said goodbye from its goodbye; one lost (closed, silent) not at all.
    Before, it was a plain set of ranks heard within 3 s, vouched for as long as a shrink
    ran."""
    monkeypatch.setattr(plane, "SILENT_S", 2.5)
    job = bootstrap.JobInfo(0, 4, "127.0.0.1", 1, "arguments")
    control = plane.ControlPlane(job, 10.0)
    control.heard = {1: 50.0, 2: 60.0, 3: 61.0}
    control.left, control.lost = {2}, {3}
    lively = control.lively()
    assert isinstance(lively, Lively) and set(lively) == {1, 2}
    assert dict(lively.until) == {1: 52.5, 2: 62.5}
    assert copy.deepcopy(lively).until == lively.until, "a copy keeps the times"


def test_a_watch_vouches_on_its_clock_and_drops_a_member_once_that_lapses():
    """forming's watch (look: a probe that always times out), its probes run one at a time
    here: the test waits for each to be filed before moving its clock."""
    clock = Clock()
    filed = threading.Semaphore(0)

    def look(rank: int) -> Verdict:
        filed.release()
        return Verdict.UNANSWERED
    watch = Watch(look, range(2), clock)

    def probe_once() -> set[int]:
        found = watch.gone([1])
        assert filed.acquire(timeout=30), "the watch's probe of rank 1 never ran"
        for t in threading.enumerate():
            if t.name == "rxelab-probe-1":
                t.join(30)
                assert not t.is_alive(), "the watch's probe of rank 1 did not end"
        return found
    while clock.now <= T0 + SILENT_S:
        assert probe_once() == set(), f"{clock.now - T0:g} s in"
        clock.now += EVERY_S
    assert watch.gone([1]) == {1} and not watch.alive(1)
