"""An abort notice that arrives over RDMA is checked, every field, before this rank uses it
(rxelab.abort_notices): the rank it blames and the mismatch's two ranks are ranks of the
job, the mismatch's ranks differ and so do its sizes, a mismatch notice comes from one of its
ranks and blames the other, the code is a known reason. A malformed notice still stops the
call, as one clear error that names its sender and what was wrong, and nothing of it goes
further: before, a notice blaming rank 2**40 became the error's peer, the control plane's
abort with that rank failed its own check (swallowed), and the job was never told over TCP.

Also: await_notices waits a named deadline and says at debug level for whom it gave up."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import rxelab
from rxelab import engine
from rxelab.control import plane
from rxelab.engine import CAUSE, Engine
from rxelab.errors import Mismatch, MismatchError, PeerError, RdmaError, Reason
from rxelab.messages import ABORT, ABORT_CODE, CTRL, CTRL_VERSION, MISMATCH, SEND_BIT, SendOp

from tests.unit.fakejob import run_ranks

P = 3  # this rank is 1; its peers 0 and 2
BIG = 1 << 40


def _engine(poll: Any = None) -> Engine:
    dev = SimpleNamespace(cq=SimpleNamespace(poll=poll or (lambda n: (0, []))), channel_fd=None,
                          status_str=lambda s: f"status {s}")
    return Engine(dev, {0: None, 2: None}, timeout=5, window=1, chunk=1,  # type: ignore[arg-type,dict-item]
                  send_depth=4, rank=1)


def _file(eng: Engine, peer: int, code: int, blamed: int | None,
          cause: tuple[int, int, int, int] | None = None, *, addr: int | None = None,
          codec: int = 0, nbytes: int = 0) -> None:
    addr = (0 if blamed is None else blamed + 1) if addr is None else addr
    data = CTRL.pack(ABORT, CTRL_VERSION, 0, 7, code, codec, addr, nbytes)
    if cause is not None:
        data += CAUSE.pack(*cause)
    eng._file_ctrl(peer, data, len(data))


@pytest.mark.parametrize("why,blamed,cause,said", [
    (Reason.FAILED, 0, None, "it failed"),  # its own failure
    (Reason.FAILED, 2, None, "rank 2 stopped"),  # another's failure passed on
    (Reason.FAILED, None, None, "it failed"),
    (Reason.FAILED, 1, None, "rank 1 stopped"),  # it blames this rank
    (Reason.STALLED, 1, None, "no progress from rank 1"),
    (Reason.DIED, 2, None, "it found dead rank 2"),
    (MISMATCH, None, None, "counts disagree with"),  # a protocol error, no cause
    (MISMATCH, 1, (0, 1, 6000, 4096), "counts disagree with rank 1"),  # the sender's notice
    (MISMATCH, 1, (1, 0, 3000, 4096), "counts disagree with rank 1"),  # the receiver's
    (Reason.FAILED, 2, (2, 1, 5, 0), "rank 2 stopped"),  # a bystander passes a mismatch on
    (Reason.FAILED, 0, (1, 2, 0, 5), "it failed"),
])
def test_a_well_formed_notice_is_filed_as_before(why, blamed, cause, said):
    eng = _engine()
    _file(eng, 0, ABORT_CODE[why], blamed, cause)
    notice = eng.box.aborts[0]
    assert (notice.words, notice.why, notice.blamed) == (said, why, blamed)
    assert notice.mismatch == (None if cause is None else Mismatch(*cause))


def test_the_codes_on_the_wire_are_those_every_version_sends():
    """Ranks of two versions read each other's notices: a code is never renumbered."""
    assert ABORT_CODE == {Reason.FAILED: 0, Reason.STALLED: 1, Reason.DIED: 2, MISMATCH: 3}


MALFORMED = {
    "a blamed rank of 2**40": (dict(code=ABORT_CODE[Reason.FAILED], blamed=BIG), "rank 1099511627776"),
    "the largest blamed rank": (dict(code=ABORT_CODE[Reason.DIED], blamed=None, addr=(1 << 64) - 1),
                                "rank 18446744073709551614"),
    "a blamed rank one past the last": (dict(code=ABORT_CODE[Reason.STALLED], blamed=P), "rank 3"),
    "an unknown code": (dict(code=99, blamed=None), "code 99"),
    "an unknown code blaming a rank": (dict(code=4, blamed=2), "code 4"),
    "a mismatch's sender out of range": (dict(code=ABORT_CODE[MISMATCH], blamed=0,
                                              cause=((1 << 32) - 1, 0, 5, 7)), "rank 4294967295"),
    "a mismatch's receiver out of range": (dict(code=ABORT_CODE[MISMATCH], blamed=3, cause=(0, 3, 5, 7)),
                                           "rank 3"),
    "a mismatch of a rank with itself": (dict(code=ABORT_CODE[MISMATCH], blamed=1, cause=(1, 1, 5, 7)),
                                         "with itself"),
    "a mismatch of equal sizes": (dict(code=ABORT_CODE[MISMATCH], blamed=1, cause=(0, 1, 4096, 4096)),
                                  "4096 bytes both"),
    "a mismatch its sender is no party to": (dict(code=ABORT_CODE[MISMATCH], blamed=2, cause=(2, 1, 5, 7)),
                                             "rank 0 is neither"),
    "a mismatch blaming a bystander": (dict(code=ABORT_CODE[MISMATCH], blamed=2, cause=(0, 1, 5, 7)),
                                       "blames rank 2"),
    "a mismatch blaming nobody": (dict(code=ABORT_CODE[MISMATCH], blamed=None, cause=(0, 1, 5, 7)),
                                  "blames no rank"),
    "a cause with a stall": (dict(code=ABORT_CODE[Reason.STALLED], blamed=1, cause=(0, 1, 5, 7)), "a cause"),
    "a codec": (dict(code=ABORT_CODE[Reason.FAILED], blamed=0, codec=2), "codec 2"),
    "a length": (dict(code=ABORT_CODE[Reason.FAILED], blamed=0, nbytes=64), "length 64"),
}


@pytest.mark.parametrize("fields,named", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_notice_stops_the_call_as_one_clear_error_of_its_sender(fields, named):
    eng = _engine()
    _file(eng, 0, **fields)
    notice = eng.box.aborts[0]  # it stops the call all the same: its sender did stop
    assert "malformed" in notice.words and named in notice.words, notice.words
    assert (notice.why, notice.blamed, notice.mismatch) == (Reason.FAILED, None, None)
    err = eng.stopped(" while this rank waited for a block")
    assert type(err) is PeerError and err.peer == 0, repr(err)  # its sender: a rank of the job
    assert err.mismatch is None
    assert str(err).startswith("rank 0 stopped the operation (its abort notice is malformed: ")


def test_a_well_formed_mismatch_notice_still_names_the_other_rank():
    eng = _engine()
    _file(eng, 0, ABORT_CODE[MISMATCH], 1, (0, 1, 6000, 4096))
    err = eng.stopped("")
    assert isinstance(err, MismatchError) and err.peer == 0
    assert "rank 0 sends 6000 bytes to this rank, which expects 4096" in str(err)


def test_the_first_notice_of_a_rank_stays_the_one_filed():
    eng = _engine()
    _file(eng, 2, ABORT_CODE[Reason.FAILED], 2)
    _file(eng, 2, ABORT_CODE[Reason.FAILED], BIG)
    assert eng.box.aborts[2].words == "it failed"


CRAFTED = {  # what rank 0 sends rank 1 instead of a notice of its own
    "blames rank 2**40, a mismatch of rank 2**32-1": dict(rkey=ABORT_CODE[MISMATCH], addr=BIG + 1,
                                                          extra=CAUSE.pack((1 << 32) - 1, 1, 5, 7)),
    "an unknown code": dict(rkey=99, addr=0, extra=b""),
    "a mismatch of rank 1 with itself": dict(rkey=ABORT_CODE[MISMATCH], addr=1 + 1,
                                             extra=CAUSE.pack(1, 1, 5, 7)),
}


@pytest.mark.parametrize("crafted", CRAFTED.values(), ids=CRAFTED.keys())
def test_a_job_told_by_a_malformed_notice_fails_cleanly_and_tells_the_control_plane(crafted,
                                                                                    monkeypatch):
    """On the in-memory fabric: rank 0 sends rank 1 a malformed abort notice and waits for
    rank 1; rank 1 (waiting for rank 0) fails naming it, rank 2 (waiting for rank 1) hears
    of it. No rank hangs, each says one RdmaError, and every rank the control plane is told
    to blame is a rank of the job (before: rank 1 blamed 2**40 there, and its TCP abort was
    never sent)."""
    blamed: list[int] = []
    lock = threading.Lock()
    abort = plane.ControlPlane.abort

    def told(self, reason, rank, *args, **kwargs):
        with lock:
            blamed.append(rank)
        return abort(self, reason, rank, *args, **kwargs)
    monkeypatch.setattr(plane.ControlPlane, "abort", told)

    def job(comm):
        buf = np.zeros(64, np.uint8)
        comm.barrier()
        try:
            if comm.rank == 0:
                comm.engine.send_ctrl(1, ABORT, 0, **crafted)
                comm.recv(buf, 1)
            else:
                comm.recv(buf, comm.rank - 1)
        except rxelab.RdmaError as err:
            return err
        return None
    start = time.monotonic()
    errors = run_ranks(P, job, timeout=8, eager_limit=0, deadline=30)
    assert time.monotonic() - start < 8, "a rank waited out its no-progress deadline"
    assert all(isinstance(err, RdmaError) for err in errors), errors
    got = errors[1]
    assert type(got) is PeerError and got.peer == 0, repr(got)
    assert "rank 0 stopped the operation (its abort notice is malformed: " in str(got), got
    assert all(getattr(err, "peer", None) in (None, *range(P)) for err in errors), errors
    assert 0 in blamed and all(rank in range(P) for rank in blamed), blamed


def test_await_notices_gives_up_at_its_named_deadline_and_says_for_whom(monkeypatch, caplog):
    monkeypatch.setattr(engine, "NOTICE_S", 0.05)
    eng = _engine()
    caplog.set_level(logging.DEBUG, logger="rxelab.engine")
    start = time.monotonic()
    eng.await_notices([SendOp(0, done=True), SendOp(2)])
    assert time.monotonic() - start < 0.5
    said = [r.getMessage() for r in caplog.records if r.name == "rxelab.engine"]
    assert len(said) == 1 and "rank 2" in said[0] and "0.05 s" in said[0] \
        and "abort notice" in said[0], said


def test_await_notices_does_not_wait_for_a_peer_whose_connection_failed(monkeypatch, caplog):
    monkeypatch.setattr(engine, "NOTICE_S", 5.0)
    failed = SimpleNamespace(wr_id=SEND_BIT | (2 << 32) | 3, status=-1, vendor_err=0)
    polls = iter([(1, [failed])])
    eng = _engine(lambda n: next(polls, (0, [])))
    caplog.set_level(logging.DEBUG, logger="rxelab.engine")
    start = time.monotonic()
    eng.await_notices([SendOp(2)])
    assert time.monotonic() - start < 1
    assert not [r for r in caplog.records if r.name == "rxelab.engine"]
