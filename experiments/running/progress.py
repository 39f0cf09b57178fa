"""Where a run is, said while it runs: case i of N, the round, the time spent, an estimate of the
time left, and the last case's result. The `latency` spec runs for most of an hour; a reader
must see it move. The estimate comes from the cases done: a case's own time in an earlier
round where it has one (a 1 MiB case takes longer than a 1 KiB one), the mean of the cases
done otherwise.

On a terminal a rich bar stays at the bottom with the results printed above it; elsewhere (CI
logs, a pipe) each case is a plain line with the same figures."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from experiments.running import caselog
from experiments.running.records import Record
from experiments.spec import Case

Step = tuple[int, int, Case]  # (round, case index, case)


def clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Estimate:
    """Time left from the steps done: each remaining step at its case's time in an earlier
    round, or at the mean of all steps done."""

    def __init__(self, steps: list[Step], now: Callable[[], float] = time.monotonic) -> None:
        self.steps, self.now = steps, now
        self.started = now()
        self.took: dict[int, float] = {}  # case index: its last round's seconds
        self.all: list[float] = []
        self.done = 0
        self._began = self.started

    def begin(self) -> None:
        self._began = self.now()

    def end(self, case: int) -> float:
        took = self.now() - self._began
        self.took[case] = took
        self.all.append(took)
        self.done += 1
        return took

    def elapsed(self) -> float:
        return self.now() - self.started

    def left(self) -> float | None:
        if not self.all:
            return None
        mean = statistics.fmean(self.all)
        return sum(self.took.get(i, mean) for _, i, _ in self.steps[self.done:])


class Lines:
    """Progress as plain lines (a log, a pipe, a test)."""

    def __init__(self, steps: list[Step], rounds: int, say: Callable[[str], None] | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        # each line as it happens: a pipe (`| tee`, a test) would hold them to the end
        self.steps, self.rounds = steps, rounds
        self.say = say or (lambda line: print(line, flush=True))
        self.estimate = Estimate(steps, now)

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def where(self, i: int, rnd: int) -> str:
        """Case i+1 of the round's cases, and the round."""
        cases = len(self.steps) // max(1, self.rounds)
        return f"[{i + 1}/{cases}" + (f", round {rnd + 1}/{self.rounds}" if self.rounds > 1
                                      else "") + "]"

    def begin(self, i: int, rnd: int, case: Case) -> None:
        self.estimate.begin()
        self.say(f"{self.where(i, rnd)} {caselog.label(case)}")

    def end(self, i: int, record: Record) -> None:
        took = self.estimate.end(i)
        left = self.estimate.left()
        self.say(f"    {record.status}: {caselog.outcome(record)} ({took:.0f} s; "
                 f"{clock(self.estimate.elapsed())} so far"
                 + (f", about {clock(left)} left)" if left is not None and left > 0 else ")"))



class Bar(Lines):
    """Progress on a terminal: each result printed as a line, a bar below them with the case,
    round, elapsed time, time left and the last result."""

    def __init__(self, steps: list[Step], rounds: int, console: Console | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.console = console or Console(highlight=False)
        super().__init__(steps, rounds, lambda s: self.console.print(s, markup=False), now)
        # markup=False: a case's label or error text ("[rank 0] ...") is text, not rich markup
        self.progress = Progress(TextColumn("{task.fields[where]}", markup=False),
                                 BarColumn(bar_width=24), TimeElapsedColumn(),
                                 TextColumn("{task.fields[left]}", markup=False),
                                 TextColumn("{task.description}", markup=False),
                                 console=self.console, transient=True)
        self.task = self.progress.add_task("", total=len(steps), where="", left="")
        self.last = ""

    def __enter__(self) -> Bar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def begin(self, i: int, rnd: int, case: Case) -> None:
        super().begin(i, rnd, case)
        self.progress.update(self.task, where=self.where(i, rnd),
                             description=caselog.label(case) + (f" | last: {self.last}"
                                                                if self.last else ""))

    def end(self, i: int, record: Record) -> None:
        super().end(i, record)
        self.last = f"{record.status} {caselog.outcome(record)}"[:60]
        left = self.estimate.left()
        self.progress.update(self.task, completed=self.estimate.done,
                             left=f"~{clock(left)} left" if left is not None else "")


def for_terminal(steps: list[Step], rounds: int) -> Lines:
    """A bar on a terminal, plain lines elsewhere."""
    console = Console(highlight=False)
    return Bar(steps, rounds, console) if console.is_terminal else Lines(steps, rounds)
