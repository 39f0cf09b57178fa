"""A rank's abort notices go out even when the mismatch that stopped it cannot travel as it
is, and a mismatch found by a coded block's sender always can.

Before: a receiver that advertised less room than the codec's header for a coded block made
its sender's mismatch expect a negative count (room - HEADER.size); CAUSE.pack raised
struct.error in Engine.post_aborts before any notice was posted, the failure handler took
that for "best effort" and told no peer over RDMA, and the control plane's abort said the
receiver "expects -8"."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from rxelab import abort_notices, codecs
from rxelab.collectives.common import Call
from rxelab.engine import Engine
from rxelab.errors import Mismatch, RdmaError, Reason
from rxelab.messages import ABORT, ABORT_CODE, CAUSE, MISMATCH

from tests.unit.fakejob import run_ranks

SMALL_ROOM = codecs.HEADER.size - 8  # room for less than a coded block's header


def _engine() -> Engine:
    dev = SimpleNamespace(cq=SimpleNamespace(poll=lambda n: (0, [])), channel_fd=None,
                          status_str=lambda s: f"status {s}")
    return Engine(dev, {0: None, 2: None}, timeout=5, window=1, chunk=1,  # type: ignore[arg-type,dict-item]
                  send_depth=4, rank=1)


@pytest.mark.parametrize("cause", [Mismatch(1, 0, 5, -3), Mismatch(1, 1 << 32, 5, 7),
                                   Mismatch(1, 0, 1 << 64, 7)],
                         ids=["negative size", "rank past 32 bits", "size past 64 bits"])
def test_a_cause_the_wire_cannot_carry_leaves_the_notices_going_out_without_it(cause,
                                                                              monkeypatch):
    eng = _engine()
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(eng, "send_ctrl", lambda peer, kind, tag, **kw: sent.append(
        dict(peer=peer, kind=kind, **kw)) or SimpleNamespace(peer=peer, done=False))
    notices = eng.post_aborts(7, MISMATCH, 0, cause)
    assert [n.peer for n in notices] == [0, 2], "every peer is told"
    assert [(s["peer"], s["kind"], s["rkey"], s["extra"]) for s in sent] == \
        [(0, ABORT, ABORT_CODE[MISMATCH], b""), (2, ABORT, ABORT_CODE[MISMATCH], b"")]


def test_a_cause_that_fits_goes_along():
    eng = _engine()
    extras: list[bytes] = []
    eng.send_ctrl = lambda peer, kind, tag, **kw: extras.append(kw["extra"])  # type: ignore[assignment,method-assign]
    eng.post_aborts(7, Reason.FAILED, 0, Mismatch(0, 1, 5, 7))
    assert extras == [CAUSE.pack(0, 1, 5, 7)] * 2


def test_a_receiver_advertising_less_than_a_header_is_a_mismatch_the_wire_carries(monkeypatch):
    """Rank 1 advertises SMALL_ROOM bytes for rank 0's coded block of an allreduce: rank 0
    finds the mismatch, its notice reaches rank 1 with the cause, which rank 1 reads as a
    well-formed mismatch (expecting 0 bytes: a room too small for any block)."""
    real = Call._advertise_staging

    def crafted(self: Call, peer: int, sub: int, offset: int, length: int, dest: Any) -> None:
        if self.rank != 1:
            return real(self, peer, sub, offset, length, dest)
        send = self.engine.send_ctrl

        def small(peer: int, kind: int, tag: int, rkey: int = 0, addr: int = 0,
                  length: int = 0, **kw: Any) -> Any:
            return send(peer, kind, tag, rkey, addr, SMALL_ROOM, **kw)
        self.engine.send_ctrl = small  # type: ignore[assignment]
        try:
            return real(self, peer, sub, offset, length, dest)
        finally:
            del self.engine.send_ctrl
    monkeypatch.setattr(Call, "_advertise_staging", crafted)

    def job(comm: Any) -> Any:
        x = np.ones(1 << 12, np.float32)
        try:
            comm.allreduce(x, np.zeros_like(x), compression="fp16")
        except RdmaError as err:
            return err
        return None
    errors = run_ranks(2, job, eager_limit=0, timeout=10, deadline=40)
    said = [str(err) for err in errors]
    assert all(isinstance(err, RdmaError) for err in errors), errors
    assert not any(re.search(r"-\d", s) for s in said), f"a negative count: {said}"
    block = (1 << 12) * 4 // 2  # rank 0's half of the allreduce
    assert f"rank 1 expects 0 bytes from rank 0, which has {block} for it" in said[0], said[0]
    assert f"rank 0 sends {block} bytes to this rank, which expects 0" in said[1], said[1]
    m = Mismatch(0, 1, block, 0)  # what rank 0's notice carries is read back as sent
    notice = abort_notices.parse(0, 2, ABORT_CODE[MISMATCH], 1 + 1, cause=CAUSE.pack(0, 1, block, 0))
    assert notice.mismatch == m and notice.blamed == 1
