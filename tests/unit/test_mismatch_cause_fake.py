"""The first cause of a failed call reaches every rank it concerns (issue 56, item 11): when
one pair of an alltoallv disagrees on a rendezvous block's size, its receiver says so in the
troubleshooting page's words, naming the sender, whoever's abort notice arrives first; the sender names the
receiver and both counts; a bystander says which rank stopped and why. Over many seeds and
delays of the in-memory fabric, every algorithm: once in three runs the receiver used to hear
a bystander's notice first and report "rank 1 stopped the operation (rank 0 stopped)"."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from rxelab.errors import RdmaError

from tests.unit.fakejob import run_ranks

pytestmark = pytest.mark.slow  # every algorithm over many seeds and delays

P = 3
BLOCK = 4096  # bytes every other pair agrees on (rendezvous: eager_limit=0)
PAIRS = list(itertools.permutations(range(P), 2))  # (sender, receiver)
COUNTS = [(6000, BLOCK), (3000, BLOCK)]  # (what the sender sends, what the receiver expects)
DELAYS = [0.0002, 0.001, 0.003]


def mismatched_alltoallv(algorithm: str, sender: int, receiver: int, sent: int, expected: int):
    def job(comm):
        r = comm.rank
        sc, rc = [BLOCK] * P, [BLOCK] * P
        if r == sender:
            sc[receiver] = sent
        if r == receiver:
            rc[sender] = expected
        try:
            comm.alltoallv(np.zeros(sum(sc), np.uint8), sc, np.zeros(sum(rc), np.uint8), rc,
                           algorithm=algorithm)
            comm.barrier()  # a bystander whose part was done hears of it here
        except RdmaError as err:
            return err
        return None
    return job


@pytest.mark.parametrize("algorithm,runs", [("parallel", 30), ("pairwise", 12),
                                            ("sequential", 12)])
def test_a_count_mismatch_is_reported_as_itself_to_both_ranks_and_the_bystander(algorithm, runs):
    for seed in range(runs):
        sender, receiver = PAIRS[seed % len(PAIRS)]
        bystander = 3 - sender - receiver
        sent, expected = COUNTS[seed // len(PAIRS) % 2]
        errors = run_ranks(P, mismatched_alltoallv(algorithm, sender, receiver, sent, expected),
                           seed=seed, max_delay=DELAYS[seed % len(DELAYS)], eager_limit=0,
                           timeout=20, deadline=60)
        run = f"run {seed} ({algorithm}, {sender}->{receiver}): "
        got = errors[receiver]
        assert f"rank {sender} sends {sent} bytes to this rank, which expects {expected}" \
            in str(got), run + f"receiver: {got!r}"
        assert getattr(got, "peer", None) == sender, run + f"receiver blames {got.peer}"
        got = errors[sender]
        assert f"rank {receiver} expects {expected} bytes from rank {sender}, which has {sent}" \
            in str(got), run + f"sender: {got!r}"
        assert getattr(got, "peer", None) == receiver, run + f"sender blames {got.peer}"
        got = errors[bystander]
        assert re.search(r"rank \d (stopped|failed in)", str(got)), run + f"bystander: {got!r}"
        assert f"rank {sender} sends {sent} bytes to rank {receiver}, which expects {expected}" \
            in str(got), run + f"bystander: {got!r}"
