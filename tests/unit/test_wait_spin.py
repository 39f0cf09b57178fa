"""How a waiting rank spends an empty poll (rxelab.waits): with spin_us 0 it arms the
completion channel at the first and sleeps on it at the next; with a spin budget it polls
until the budget is spent, and sleeps only then. The clock is the test's own."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from rxelab import waits
from rxelab.waits import Counters, Mailbox, Waits


class Channel:
    """A completion channel whose event is always there: a sleep on it returns at once."""

    def __init__(self) -> None:
        self.channel_fd, self._w = os.pipe()
        os.write(self._w, b"x")
        self.armed = self.taken = 0

    def arm(self) -> None:
        self.armed += 1

    def take_event(self) -> None:
        self.taken += 1

    def close(self) -> None:
        os.close(self.channel_fd)
        os.close(self._w)


class Waiter(Waits):
    def __init__(self, dev: Channel, spin_s: float, empty_before_done: int) -> None:
        self.dev = dev  # type: ignore[assignment]
        self.box = Mailbox()
        self.counters = Counters()
        self.conns = {}
        self.timeout = 60.0
        self.spin_s = spin_s
        self.armed = False
        self.watch = None
        self.left = empty_before_done

    def progress(self) -> bool:
        self.left -= 1
        return False

    def done(self) -> bool:
        return self.left <= 0


@pytest.fixture
def channel() -> Iterator[Channel]:
    c = Channel()
    yield c
    c.close()


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 us per reading: the budget is spent after as many polls as it has microseconds."""
    now = [0.0]

    def tick() -> float:
        now[0] += 1e-6
        return now[0]

    monkeypatch.setattr(waits.time, "monotonic", tick)


def test_without_a_budget_the_first_empty_poll_arms_and_the_next_sleeps(channel: Channel) -> None:
    w = Waiter(channel, spin_s=0.0, empty_before_done=6)
    w.wait(w.done, "a test's condition")
    assert w.counters.empty_polls == 6
    assert channel.armed >= 2 and w.counters.sleeps >= 2 and channel.taken == w.counters.sleeps


def test_a_budget_polls_without_sleeping_while_it_lasts(channel: Channel) -> None:
    w = Waiter(channel, spin_s=1e-3, empty_before_done=200)  # 1000 us: more than 200 polls
    w.wait(w.done, "a test's condition")
    assert w.counters.empty_polls == 200
    assert channel.armed == 0 and w.counters.sleeps == 0


def test_a_spent_budget_sleeps_as_without_one(channel: Channel) -> None:
    w = Waiter(channel, spin_s=20e-6, empty_before_done=200)  # spent after about 20 polls
    w.wait(w.done, "a test's condition")
    assert w.counters.empty_polls == 200
    assert w.counters.sleeps > 50 and channel.armed > 50
