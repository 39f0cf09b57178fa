"""Failures carry their reason from where they are raised (issue 29): what a rank tells its
peers when it stops is chosen by the reason, never by the message's words."""

from __future__ import annotations

import socket
import time

import pytest
from rxelab import messages
from rxelab.comm.guard import abort_reason
from rxelab.control import framing
from rxelab.errors import MismatchError, PeerError, ProtocolError, Reason


@pytest.mark.parametrize(("reason", "told"), [
    (Reason.DIED, Reason.DIED), (Reason.SILENT, Reason.DIED),
    (Reason.STALLED, Reason.STALLED), (Reason.ABORTED, Reason.FAILED),
    (Reason.FAILED, Reason.FAILED)])
def test_the_abort_a_rank_sends_follows_the_reason(reason, told):
    assert abort_reason(PeerError("something", peer=1, reason=reason)) == told


def test_the_words_of_a_message_do_not_choose_the_abort():
    assert abort_reason(PeerError("rank 1 is gone, no progress")) == Reason.FAILED
    assert abort_reason(PeerError("fine words", reason=Reason.SILENT)) == Reason.DIED


def test_disagreements_abort_as_mismatches():
    assert abort_reason(MismatchError("counts")) == messages.MISMATCH
    assert abort_reason(ProtocolError("bad frame")) == messages.MISMATCH
    assert abort_reason(KeyboardInterrupt()) == Reason.FAILED


def test_a_peer_that_says_nothing_is_silent_and_one_that_closes_died():
    a, b = socket.socketpair()
    try:
        with pytest.raises(PeerError) as silent:
            framing.recv(a, deadline=time.monotonic() + 0.2, peer="rank 1")
        assert silent.value.reason == Reason.SILENT and silent.value.lost
        b.close()
        with pytest.raises(PeerError) as died:
            framing.recv(a, deadline=time.monotonic() + 2, peer="rank 1")
        assert died.value.reason == Reason.DIED and died.value.lost
    finally:
        a.close()


def test_a_stalled_operation_is_not_taken_for_a_death():
    err = PeerError("no progress", reason=Reason.STALLED)
    assert not err.lost and err.reason == "no progress"


def test_a_death_rank_0_passes_on_reaches_every_rank_as_a_death():
    """The other ranks hear of rank 2's death from rank 0 (the control plane is a star): they
    learn it as a death of rank 2, not as "some rank aborted", and their own aborts say so."""
    from tests.unit.fakejob import die, run_ranks, settle

    def job(comm):
        settle(comm)
        if comm.rank == 2:
            die(comm)
            return None
        with pytest.raises(PeerError) as err:
            comm.barrier()
        return err.value.peer, err.value.reason
    out = run_ranks(5, job, timeout=20)
    assert [out[r] for r in (0, 1, 3, 4)] == [(2, Reason.DIED)] * 4, out
