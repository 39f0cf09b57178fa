"""What the elastic tests on the in-memory fabric share (issue 18): the job's secret, a rank's
death, and the checks that the members agree and compute correctly. Kept apart so that each
test file holds one promise of elastic membership and none copies another's helpers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from rxelab.comm import Communicator
from rxelab.errors import PeerError

from tests.unit.fakejob import die, settle


@pytest.fixture(autouse=True)
def secret(monkeypatch):
    """Elastic jobs need a secret (the ranks are threads: one environment)."""
    monkeypatch.setenv("RXELAB_JOB_TOKEN", "o7MjB-iDsO6_bnLEIFBkYMa20z0jsE4Ee0KvJk83iU4")


class Died(BaseException):
    """A rank's thread ends as a killed process would (its sockets closed)."""


def total(ids: list[int]) -> float:
    return float(sum(i + 1 for i in ids))


def checked_allreduce(comm: Communicator, ids: list[int], me: int) -> float:
    """An allreduce of each rank's (original id + 1): the sum over the members' ids."""
    x = np.full(257, me + 1.0)
    y = np.empty_like(x)
    comm.allreduce(x, y)
    assert np.all(y == total(ids)), (y[0], ids)
    return float(y[0])


def until_failure(comm: Communicator) -> None:
    """A survivor's work until a death is noticed."""
    with pytest.raises(PeerError):
        for _ in range(200):
            comm.allreduce(np.ones(64), np.empty(64))


def dies(comm: Communicator, victims: Any) -> bool:
    """Every rank settles; a victim then dies (and says so)."""
    settle(comm)
    if comm.rank in victims:
        die(comm)
        return True
    return False


def after_losing(comm: Communicator, victims: set[int] | tuple[int, ...], **shrink: Any) -> Any:
    """Every rank settles, the victims die; the others wait for the failure and shrink: the
    new communicator, None on a victim, "died" on a rank that died in the shrink."""
    if dies(comm, victims):
        return None
    until_failure(comm)
    try:
        return comm.shrink(**shrink)
    except Died:
        return "died"


def members_of(comm: Communicator, me: int) -> list[int]:
    """The original ids of the communicator's ranks, in rank order."""
    ids = np.empty(comm.size, np.int64)
    comm.allgather(np.array([me], np.int64), ids)
    return [int(i) for i in ids]
