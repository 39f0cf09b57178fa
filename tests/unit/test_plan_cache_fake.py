"""A plan that can no longer run (its array moved) is replaced by the plan made for the same
call, and let go of (its exports released); the other kept plans stay. Before, a full cache
dropped its oldest plan, an unrelated one, to make room for the replacement, and the plan
replaced was never released."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from rxelab.comm import MAX_PLANS

from tests.unit.fakejob import run_ranks
from tests.unit.test_plan_keys_fake import move_in_place


def _released(view: memoryview) -> bool:
    try:
        view.tobytes()
    except ValueError:  # "operation forbidden on released memoryview object"
        return True
    return False


def test_a_plan_that_can_no_longer_run_is_replaced_in_place_and_released():
    """MAX_PLANS allgathers, each from a bytearray (held by an export) into an array; one
    array is moved, and its call made again."""
    def job(comm: Any) -> Any:
        sends = [bytearray(4) for _ in range(MAX_PLANS)]
        recvs = [np.zeros(8, np.uint8) for _ in range(MAX_PLANS)]
        for s, r in zip(sends, recvs, strict=True):
            comm.allgather(s, r)
        before = {id(p): p for p in comm.plans.values()}
        assert len(before) == MAX_PLANS
        old = next(p for p in before.values() if p.layout.recv.owner is recvs[3])
        holders = move_in_place(recvs[3])
        sends[3][:] = bytes([comm.rank + 1]) * 4
        comm.allgather(sends[3], recvs[3])
        after = {id(p): p for p in comm.plans.values()}
        others = set(before) - {id(old)}
        return (len(after), others <= set(after), id(old) in after,
                [_released(v) for v in old.exports], recvs[3].copy(), holders)

    for kept, others_kept, old_kept, released, got, holders in run_ranks(2, job):
        assert list(got) == [1] * 4 + [2] * 4 and all((h == 0).all() for h in holders)
        assert kept == MAX_PLANS and not old_kept
        assert others_kept, "no other plan was dropped to make room"
        assert released == [True], "the replaced plan's export of its bytearray is released"


@pytest.mark.parametrize("extra", [1, 3])
def test_the_oldest_plan_dropped_for_room_is_released(extra):
    def job(comm: Any) -> Any:
        sends = [bytearray(4) for _ in range(MAX_PLANS + extra)]
        recv = np.zeros(8, np.uint8)
        plans = []
        for s in sends:
            comm.allgather(s, recv)
            plans.append(next(p for p in comm.plans.values() if p.layout.send.owner is s))
        kept = {id(p) for p in comm.plans.values()}
        return [(id(p) in kept, _released(p.exports[0])) for p in plans]

    for states in run_ranks(2, job):
        assert states == [(False, True)] * extra + [(True, False)] * MAX_PLANS, states
