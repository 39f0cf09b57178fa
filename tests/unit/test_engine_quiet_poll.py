"""Engine.poll_quietly, the poll of a call that failed already, passes over only what is more
of the same: a failed completion (PeerError, its peer then unreachable) and a malformed
message (ProtocolError, a MismatchError among them). Anything else is a fault of this rank's
own code and goes up: before, `except Exception: pass` hid a KeyError or a TypeError there
while the rank waited for its abort notices or explained a failure."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from rxelab.engine import Engine
from rxelab.errors import MismatchError, PeerError, ProtocolError
from rxelab.messages import DATA_BIT, SEND_BIT, SendOp
from rxelab.transports import base

DONE = SimpleNamespace(wr_id=SEND_BIT | (2 << 32) | 3, status=base.WC_SUCCESS, vendor_err=0)


def _engine(wcs: list[Any]) -> Engine:
    polls = iter([(len(wcs), wcs)])
    dev = SimpleNamespace(cq=SimpleNamespace(poll=lambda n: next(polls, (0, []))),
                          channel_fd=None, status_str=lambda s: f"status {s}")
    return Engine(dev, {0: None, 2: None}, timeout=5, window=1, chunk=1,  # type: ignore[arg-type,dict-item]
                  send_depth=4, rank=1)


def _raising(eng: Engine, err: BaseException, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The engine's _complete raises err for the first completion and files the rest."""
    filed: list[Any] = []

    def complete(wc: Any) -> None:
        if not filed:
            filed.append(wc)
            raise err
        filed.append(wc)
    monkeypatch.setattr(eng, "_complete", complete)
    return filed


@pytest.mark.parametrize("err", [PeerError("write failed", peer=2),
                                 ProtocolError("control message of 3 bytes from rank 2"),
                                 MismatchError("counts differ", peer=2)],
                         ids=["failed completion", "malformed message", "mismatch"])
def test_more_of_the_same_is_passed_over_and_the_rest_of_the_batch_filed(err, monkeypatch):
    eng = _engine([DONE, DONE])
    filed = _raising(eng, err, monkeypatch)
    unreachable: set[int | None] = set()
    assert eng.poll_quietly(unreachable) == 2
    assert len(filed) == 2, "the completion after it is filed too"
    assert unreachable == ({2} if isinstance(err, PeerError) else set())


@pytest.mark.parametrize("err", [KeyError(7), TypeError("unsupported operand"),
                                 AssertionError("slot accounting")])
def test_a_fault_of_this_ranks_own_code_goes_up(err, monkeypatch):
    eng = _engine([DONE])
    _raising(eng, err, monkeypatch)
    with pytest.raises(type(err)):
        eng.poll_quietly()


def test_a_completion_the_engine_has_no_record_of_goes_up_from_await_notices():
    """The real _complete: a write's completion whose chunk nothing posted is a KeyError,
    no message from a peer; waiting for the abort notices does not swallow it."""
    unknown = SimpleNamespace(wr_id=SEND_BIT | DATA_BIT | (2 << 40) | 5,
                              status=base.WC_SUCCESS, vendor_err=0)
    eng = _engine([unknown])
    with pytest.raises(KeyError):
        eng.await_notices([SendOp(2)])
