"""The collectives' schedules, checked exhaustively for world sizes 1..12."""

import itertools

import pytest
from rxelab import schedules as s

SIZES = range(1, 13)


@pytest.mark.parametrize("p", SIZES)
def test_sequential_covers_every_ordered_pair_exactly_once(p):
    directed = [d for i, j in s.sequential_pairs(p) for d in ((i, j), (j, i))]
    assert sorted(directed) == sorted(itertools.permutations(range(p), 2))


def simulate_sequential(p):
    """Play the token rules as a discrete simulation: at each step, which ranks may move data.
    Returns the list of steps in the order they ran and the active ranks at each moment."""
    steps = s.sequential_steps(p)
    done = set()  # finished steps
    tokens = set()  # (step, rank) tokens delivered
    timeline = []
    for k, step in enumerate(steps):
        for r in step.pair:
            if s.needs_token(steps, k, r):
                assert (k, r) in tokens, f"rank {r} would start step {k} without a token"
            elif k > 0:  # it was in step k - 1, or its partner was and starts step k
                assert k - 1 in done and s.starter(steps, k) in steps[k - 1].pair
                assert r in steps[k - 1].pair or s.starter(steps, k) != r
        timeline.append(set(step.pair))
        done.add(k)
        for r in s.token_receivers(steps, k):
            tokens.add((k + 1, r))
    return timeline


@pytest.mark.parametrize("p", SIZES)
def test_strict_sequential_never_has_two_pairs_active(p):
    timeline = simulate_sequential(p)
    assert len(timeline) == p * (p - 1) // 2
    assert all(len(active) == 2 for active in timeline), "exactly one pair at a time"


def test_sequential_order_is_the_documented_lexicographic_one():
    assert s.sequential_pairs(4) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    steps = s.sequential_steps(4)
    assert s.starter(steps, 1) == 0 and s.token_receivers(steps, 0) == []  # (0,1) -> (0,2)
    assert s.starter(steps, 3) is None  # (0,3) -> (1,2): both were idle
    assert s.token_receivers(steps, 2) == [1, 2]
    assert s.starter(steps, 4) == 1 and s.starter(steps, 5) == 3  # (1,2)->(1,3)->(2,3)
    assert s.token_receivers(steps, 5) == []


@pytest.mark.parametrize("p", SIZES)
def test_the_turn_rides_with_the_data_wherever_a_rank_knows_first_hand(p):
    """Tokens only where neither rank of a step was in the one before: none for 3 ranks, and
    for p ranks only at (i, p-1) -> (i+1, i+2) with i + 2 < p - 1."""
    steps = s.sequential_steps(p)
    tokens = [(steps[k].pair, steps[k + 1].pair) for k in range(len(steps) - 1)
              if s.token_receivers(steps, k)]
    assert tokens == [((i, p - 1), (i + 1, i + 2)) for i in range(p - 3)]
    for k in range(1, len(steps)):
        first = s.starter(steps, k)
        assert first is None or (first in steps[k].pair and first in steps[k - 1].pair)


@pytest.mark.parametrize("p", SIZES)
def test_pairwise_sends_to_and_receives_from_everyone_once(p):
    for r in range(p):
        sched = s.pairwise(p, r)
        assert sorted(d for d, _ in sched) == [x for x in range(p) if x != r]
        assert sorted(src for _, src in sched) == [x for x in range(p) if x != r]
    for step in range(p - 1):  # every send meets its receive in the same step
        for r in range(p):
            dst, _ = s.pairwise(p, r)[step]
            assert s.pairwise(p, dst)[step][1] == r


@pytest.mark.parametrize("p", SIZES)
def test_ring_allgather_delivers_every_block_everywhere(p):
    have = {r: {r} for r in range(p)}
    for step in range(p - 1):
        moves = []
        for r in range(p):
            send_block, _ = s.ring_allgather(p, r)[step]
            assert send_block in have[r], "a rank only forwards what it already has"
            moves.append(((r + 1) % p, send_block))
        for dst, block in moves:
            assert s.ring_allgather(p, dst)[step][1] == block
            have[dst].add(block)
    assert all(h == set(range(p)) for h in have.values())


def simulate_window(p: int, window: int, seed: int) -> int:
    """Discrete-event play of the sequential schedule with a window: every rank starts its
    pairs in the global order (several may be open at once), a pair lasts a random time once
    both partners started it, the turn rules are enforced. Returns the most pairs ever active
    at once (and fails on a deadlock)."""
    import heapq
    import random

    rng = random.Random(seed)
    steps = s.sequential_steps(p)
    mine = {r: [k for k, st in enumerate(steps) if r in st.pair] for r in range(p)}
    pos = dict.fromkeys(range(p), 0)  # index into mine[r]: the pair each rank is at
    done, tokens, started, active, most = set(), set(), set(), set(), 0
    now, events = 0.0, []

    def ready(k: int) -> bool:
        for r in steps[k].pair:
            if mine[r][pos[r]] != k:
                return False  # still busy with an earlier pair of its own
            if s.needs_token(steps, k, r, window):
                if (k, r) not in tokens:
                    return False
            elif k >= window and k - window not in done:
                return False
        return True

    while len(done) < len(steps):
        for k in range(len(steps)):
            if k not in started and ready(k):
                started.add(k)
                active.add(k)
                for r in steps[k].pair:  # each partner moves on to its next pair at once
                    pos[r] += 1 if pos[r] + 1 < len(mine[r]) else 0
                most = max(most, len(active))
                heapq.heappush(events, (now + rng.uniform(0.1, 1.0), k))
        assert events, f"deadlock with {len(done)} of {len(steps)} pairs done"
        now, k = heapq.heappop(events)
        active.discard(k)
        done.add(k)
        for r in s.token_receivers(steps, k, window):
            tokens.add((k + window, r))
    return most


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_a_window_of_k_pairs_keeps_at_most_k_active_and_never_deadlocks(p):
    total = p * (p - 1) // 2
    for window in sorted({min(w, total) for w in (1, 2, 3, total // 2 or 1, total)}):
        most = max(simulate_window(p, window, seed) for seed in range(5))
        assert most == window, (p, window, most)  # never more, and the dial really opens


@pytest.mark.parametrize("p", range(2, 9))
@pytest.mark.parametrize("window", [1, 2, 3])
def test_each_ranks_turns_agree_with_its_partners_and_the_tokens_they_wait_for(p, window):
    turns = {r: s.sequential_turns(p, r, window) for r in range(p)}
    by_step = {}
    for r, mine in turns.items():
        assert [t.step for t in mine] == sorted(t.step for t in mine)  # in the global order
        for t in mine:
            by_step.setdefault(t.step, {})[r] = t
    steps = s.sequential_steps(p)
    assert sorted(by_step) == list(range(len(steps)))
    handed = {}  # (step, rank) -> the leader that hands it the turn
    for k, both in by_step.items():
        (a, ta), (b, tb) = sorted(both.items())
        assert (a, b) == steps[k].pair and ta.partner == b and tb.partner == a
        assert {ta.role, tb.role} in ({s.BOTH}, {s.STARTED, s.ANSWERED})
        first = s.starter(steps, k, window)  # the one that was in step k - window starts
        assert first is None or both[first].role == s.STARTED
        if ta.role == s.BOTH and k >= window:  # neither was in step k - window
            assert ta.token_from == tb.token_from == steps[k - window].leader
            assert a not in steps[k - window].pair and b not in steps[k - window].pair
        else:
            assert ta.token_from is tb.token_from is None
        assert tb.hands_to == ()  # only the leader hands the turn on
        for r in ta.hands_to:
            handed[(k + window, r)] = a
    waiting = {(t.step, r): t.token_from for r, mine in turns.items() for t in mine
               if t.token_from is not None}
    assert handed == waiting
