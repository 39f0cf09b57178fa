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
    done: set[int] = set()
    tokens: set[tuple[int, int]] = set()
    started: set[int] = set()
    active: set[int] = set()
    most = 0
    now = 0.0
    events: list[tuple[float, int]] = []

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


# ---- issue 27, item 17: the walk at any size the library accepts ------------------------------
def reference_turns(p: int, rank: int, window: int) -> list[tuple]:
    """The turns as the rules over the whole walk define them (O(p^3): small p only)."""
    steps = s.sequential_steps(p)
    out, last = [], -1
    for k, step in enumerate(steps):
        if rank not in step.pair:
            continue
        partner = step.pair[1] if step.pair[0] == rank else step.pair[0]
        first = s.starter(steps, k, window)
        role = s.STARTED if first == rank else s.ANSWERED if first == partner else s.BOTH
        token_from = steps[k - window].leader if role == s.BOTH and k >= window else None
        hands = tuple(s.token_receivers(steps, k, window)) if rank == step.leader else ()
        watchers = sorted({r for st in steps[k + 1:] for r in st.pair} - {rank, partner})
        out.append((k, partner, role, token_from, hands, -(-(k - last - 1) // window) + 1, watchers))
        last = k
    return out


@pytest.mark.parametrize("p", range(1, 13))
@pytest.mark.parametrize("window", [1, 2, 3, 7])
def test_the_turns_worked_out_per_rank_equal_the_rules_over_the_whole_walk(p, window):
    for rank in range(p):
        got = [(t.step, t.partner, t.role, t.token_from, t.hands_to, t.patience, list(t.watchers))
               for t in s.sequential_turns(p, rank, window)]
        assert got == reference_turns(p, rank, window), (p, rank, window)


@pytest.mark.parametrize("p", [4, 9, 400, 1024])
def test_tokens_are_numbered_by_their_receivers_own_turn_and_fit_a_tag_at_any_size(p):
    """Before, a token's tag was STEP0 + its step: past 65519 steps (p >= 363) a call was
    refused, "schedule too long". Now it is the receiver's own count of its turns (< p), and
    every hand-over meets the wait it is for."""
    from rxelab.collectives.common import MAX_SUB, STEP0

    ranks = range(p) if p <= 9 else (0, 1, p // 2, p - 3, p - 1)
    window = 1
    turns = {r: s.sequential_turns(p, r, window) for r in ranks}
    for r, mine in turns.items():
        assert [t.index for t in mine] == list(range(p - 1))
        for t in mine:
            assert STEP0 + t.index <= MAX_SUB
            for receiver, index in zip(t.hands_to, t.hand_index, strict=True):
                theirs = s.sequential_turns(p, receiver, window)[index]
                assert theirs.step == t.step + window and theirs.token_from == r


def test_pair_arithmetic_inverts():
    for p in (2, 3, 5, 64, 1025):
        for k in list(range(min(200, p * (p - 1) // 2))) + [p * (p - 1) // 2 - 1]:
            i, j = s.pair_at(k, p)
            assert 0 <= i < j < p and s.step_of(i, j, p) == k


def test_the_pair_some_steps_away_is_the_walks_own_within_a_row_and_across_rows():
    for p in (2, 3, 5, 17, 40):
        total = p * (p - 1) // 2
        for k in range(total):
            i, j = s.pair_at(k, p)
            for d in (-17, -3, -2, -1, 1, 2, 3, 16):
                if 0 <= k + d < total:
                    assert s.pair_beside(i, j, d, p) == s.pair_at(k + d, p)


def test_a_job_larger_than_the_library_supports_is_refused_at_init():
    from rxelab.bootstrap import MAX_RANKS, discover
    from rxelab.collectives.common import MAX_SUB, STEP0
    from rxelab.errors import ConfigError

    # the widest schedule, the ring allreduce's two phases, fits its tags at the limit
    assert STEP0 + 2 * MAX_RANKS <= MAX_SUB

    with pytest.raises(ConfigError, match=f"{MAX_RANKS} ranks rxelab supports"):
        discover(0, MAX_RANKS + 1, "127.0.0.1", 29500)
    assert discover(0, MAX_RANKS, "127.0.0.1", 29500).world_size == MAX_RANKS
