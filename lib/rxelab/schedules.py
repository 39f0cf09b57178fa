"""Who talks to whom, and when: the schedules of the collectives, as plain data.

The sequential schedule also takes a window (`pairs=k` in the API): at most k pairs exchange
at once, in the same fixed order - a dial from strictly sequential (k = 1) to all pairs at
once (k = p(p-1)/2): the seed's trade-off of time against memory and network load.

Kept apart from the verbs code so they can be checked exhaustively on any machine: every
ordered pair exactly once, and the strictly sequential schedule never has two pairs active.

Strictly sequential (all-to-all and allgather) — the seed's core idea. The job walks the
unordered pairs {i, j}, i < j, in lexicographic order: (0,1), (0,2), ..., (0,p-1), (1,2), ...
While a pair is active its two ranks exchange their blocks; no other rank moves data. Step k
may start once step k-1 is over (k - window, with a window), and the turn passes on so:
- a rank of step k that was also in step k-1 knows first-hand when that step is over (its
  own block acknowledged or answered, its partner's arrived). It is the step's *starter*: it
  sends its block at once, and that block is the turn for its partner (the *follower*), who
  answers with its own block when it arrives. No message besides the data: two pairs share
  at most one rank, so a step has at most one starter.
- when neither rank of step k was in step k-1, both wait for a token from step k-1's leader
  (its lower rank), which sends it only after its own block was acknowledged and the
  partner's had arrived; then both send at once, as the first steps do.
For 3 ranks that is no token at all; for p ranks, tokens only where the walk moves from
(i, p-1) to (i+1, i+2).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SeqStep:
    pair: tuple[int, int]
    leader: int  # the lower rank: hands the turn on when the exchange is complete


def sequential_pairs(p: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(p) for j in range(i + 1, p)]


@functools.lru_cache(maxsize=64)
def sequential_steps(p: int) -> tuple[SeqStep, ...]:
    """Made once per world size (every call of a sequential collective walks it)."""
    return tuple(SeqStep(pair, pair[0]) for pair in sequential_pairs(p))


def starter(steps: Sequence[SeqStep], k: int, window: int = 1) -> int | None:
    """The rank of step k that starts it by sending its block (its partner waits for that
    block: it is the turn): the one that was in step k - window. None when both start
    together: in the first `window` steps, and when neither was in step k - window."""
    if k < window:
        return None
    before = steps[k - window].pair
    for r in steps[k].pair:
        if r in before:
            return r
    return None


def needs_token(steps: Sequence[SeqStep], k: int, rank: int, window: int = 1) -> bool:
    """Must `rank` (a member of step k) wait for a token before step k? Step k may start when
    step k - window is over; a member of that step knows from its own completions and starts
    step k, its partner waits for the starter's block; only when neither member was in it do
    both wait for a token from its leader. window = 1 is the strictly sequential schedule; a
    window of w keeps at most w pairs active (one per chain k, k + w, k + 2w, ...)."""
    return k >= window and rank in steps[k].pair and starter(steps, k, window) is None


def token_receivers(steps: Sequence[SeqStep], k: int, window: int = 1) -> list[int]:
    """Ranks that step k's leader must hand the turn to when step k completes."""
    if k + window >= len(steps):
        return []
    return [r for r in steps[k + window].pair if needs_token(steps, k + window, r, window)]


BOTH, STARTED, ANSWERED = 0, 1, 2  # how a rank takes part in a step of the sequential walk


@dataclass(frozen=True)
class Turn:
    """One step of the sequential walk as one rank takes part in it."""

    step: int
    partner: int
    role: int  # STARTED: sends at once; ANSWERED: sends once the partner's block came; BOTH
    token_from: int | None  # BOTH after the first window: the leader whose token it waits for
    hands_to: tuple[int, ...]  # when this rank leads the step: who gets the turn at its end
    patience: int  # deadlines a wait for this turn allows: one per step since this rank's last
    watchers: Later  # the other ranks of later steps: they wait behind this one
    index: int = 0  # this rank's own count of its turns: the tag of a token it waits for
    hand_index: tuple[int, ...] = ()  # each of hands_to's own count of the turn it gets


# Pair arithmetic: step k of the walk is pair (i, j), i < j, rows i = 0..p-2 in order. What a
# rank needs of the walk is worked out from these in O(1) per step, so its p - 1 turns cost
# O(p log p) to make, whatever p (the walk itself has p(p-1)/2 steps).
def step_of(i: int, j: int, p: int) -> int:
    return i * (2 * p - i - 1) // 2 + (j - i - 1)


def pair_at(k: int, p: int) -> tuple[int, int]:
    """The pair of step k (the inverse of step_of), in O(1): row i starts at step
    i(2p-i-1)/2, so the row of k is the root of a quadratic (isqrt, then nudged where the
    integer root lands one off)."""
    b = 2 * p - 1
    i = max(0, (b - math.isqrt(max(0, b * b - 8 * k))) // 2)
    while i > 0 and step_of(i, i + 1, p) > k:
        i -= 1
    while i < p - 2 and step_of(i + 1, i + 2, p) <= k:
        i += 1
    return i, i + 1 + k - step_of(i, i + 1, p)


def pair_beside(i: int, j: int, d: int, p: int) -> tuple[int, int]:
    """The pair d steps after (i, j) (before, for d < 0): within its row by arithmetic alone,
    pair_at only where the step crosses into another row."""
    if i < j + d < p:
        return i, j + d
    return pair_at(step_of(i, j, p) + d, p)


def turn_index(pair: tuple[int, int], rank: int) -> int:
    """Which of `rank`'s own turns the step of `pair` is: its pairs come in the walk's order
    (0, r), (1, r), ..., (r-1, r), (r, r+1), ..., (r, p-1)."""
    i, j = pair
    return i if rank == j else j - 1


@dataclass(frozen=True)
class Later:
    """The ranks of the steps after pair (i, j) but the pair's own, ascending: the rest of
    row i and every later row hold exactly the ranks i+1..p-1 (only the last pair has none
    after it). Iterated where a long transfer tells them it moves; O(1) to keep."""

    i: int
    j: int
    p: int

    def __iter__(self) -> Iterator[int]:
        if self.i <= self.p - 3:
            yield from (r for r in range(self.i + 1, self.p) if r != self.j)


def _shared(now: tuple[int, int], before: tuple[int, int]) -> int | None:
    """The rank of pair `now` that was in pair `before` (the starter), if any."""
    for r in now:
        if r in before:
            return r
    return None


@functools.lru_cache(maxsize=256)
def sequential_turns(p: int, rank: int, window: int = 1) -> tuple[Turn, ...]:
    """This rank's steps of the sequential walk, with the turn rules above worked out once
    (every call of a sequential collective walks them): the same turns as the rules over the
    whole walk (starter, needs_token, token_receivers) give, in O(p log p). Each turn needs
    the pairs `window` steps before and after its own: two lookups (the recording of a
    p = 1024 walk makes a million turns)."""
    total = p * (p - 1) // 2
    turns = []
    last = -1  # this rank's previous step
    pairs = [(a, rank) for a in range(rank)] + [(rank, b) for b in range(rank + 1, p)]
    for index, (i, j) in enumerate(pairs):
        k = step_of(i, j, p)
        partner = j if i == rank else i
        before = pair_beside(i, j, -window, p) if k >= window else None
        first = None if before is None else _shared((i, j), before)
        role = STARTED if first == rank else ANSWERED if first == partner else BOTH
        token_from = before[0] if role == BOTH and before is not None else None
        hands: tuple[int, ...] = ()
        after: tuple[int, int] | None = None
        if rank == i and k + window < total:  # the leader: who of the step a window on
            after = pair_beside(i, j, window, p)  # waits for a token from it
            if _shared(after, (i, j)) is None:
                hands = after
        # the steps between this rank's last one and this, `window` at a time, plus its own
        patience = -(-(k - last - 1) // window) + 1
        turns.append(Turn(k, partner, role, token_from, hands, patience, Later(i, j, p),
                          index, tuple(turn_index(after, r) for r in hands) if after else ()))
        last = k
    return tuple(turns)


@functools.lru_cache(maxsize=256)
def pairwise(p: int, rank: int) -> tuple[tuple[int, int], ...]:
    """Pairwise exchange: step s = 1..p-1 sends to (r+s) mod p, receives from (r-s) mod p."""
    return tuple(((rank + s) % p, (rank - s) % p) for s in range(1, p))


@functools.lru_cache(maxsize=256)
def ring_allgather(p: int, rank: int) -> tuple[tuple[int, int], ...]:
    """Ring allgather: step s = 0..p-2 forwards block (r-s) mod p to the right neighbour and
    receives block (r-s-1) mod p from the left one. Returns (send_block, recv_block)."""
    return tuple(((rank - s) % p, (rank - s - 1) % p) for s in range(p - 1))


STAR_ROOT = 0
