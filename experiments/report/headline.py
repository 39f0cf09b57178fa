"""The report's headline, what a reader reads first: per collective on a clean network, the best
rxelab algorithm at each size and the share of each other contender's time it takes, in words
that say who takes what share of whose time and whether that is faster ("rxelab (best per size)
takes 0.87x the time of MPI over UCX: 13 % less, faster"), judged by the rounds' spread: a
difference inside it is said to be none. Contenders are named as a reader says them (MPI over
UCX, not mpi-ucx)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from rxelab.codecs import NAMES as CODEC_NAMES
from rxelab.settings import TRANSPORTS

from experiments.readable import size_text
from experiments.report.view import (
    SETTING,
    Row,
    ours_,
    overlap,
    setting_title,
    settings,
    spread,
)

OURS = "rxelab (best per size)"  # who the headline's ratios are of
TITLES = {"mpi-ucx": "MPI over UCX", "mpi-tcp": "MPI over TCP", "gloo": "Gloo",
          "pyverbs": "pyverbs (the hand loop)"}


def contender_title(contender: str) -> str:
    """A contender as a reader says it, not as experiments.spec.contender spells it: MPI over
    UCX (mpi-ucx), Gloo, rxelab over tcp (rxelab-tcp), "rxelab over tcp, eager limit 0, zstd";
    a name it does not know, as it is."""
    if contender in TITLES:
        return TITLES[contender]
    first, *parts = contender.split("-")
    if first != "rxelab":
        return contender
    over, other = "", []
    for p in parts:
        if p in TRANSPORTS:
            over = f" over {p}"
        elif p.startswith("eager") and p[5:].isdigit():
            other.append(f"eager limit {p[5:]}")
        elif p in CODEC_NAMES:
            other.append(p)
        else:
            return contender
    return ", ".join(["rxelab" + over, *other])


def time_change(ratio: float) -> str:
    """A ratio of times as the share more or less it is: 0.87 -> "13 % less"."""
    pct = round(abs(ratio - 1) * 100)
    if pct == 0:
        return "the same time"
    return f"{pct} % {'less' if ratio < 1 else 'more'}"


@dataclass
class Rival:
    name: str  # the contender (experiments.spec.contender)
    ratio: float  # best rxelab's time over the rival's: geometric mean over sizes
    low: float  # ...of our fastest round over their slowest, per size
    high: float  # ...of our slowest round over their fastest
    sizes: int
    faster: int  # sizes where even the spread's worst case is faster
    slower: int
    judged: int = 0  # sizes both ran in several rounds: a spread to judge by
    words: str = ""

    @property
    def title(self) -> str:
        return contender_title(self.name)

    @property
    def tone(self) -> str:
        """faster or slower where the rounds' whole spread (its geometric mean over the sizes)
        is on one side of 1, else same."""
        return "faster" if self.high < 1 else "slower" if self.low > 1 else "same"

    @property
    def change(self) -> str:
        """How much less or more time, and whether that is faster: "13 % less, faster" (over
        several sizes: of their geometric mean, "on the whole" where sizes differ)."""
        said = time_change(self.ratio) + (f" (geometric mean of {self.sizes} sizes)"
                                          if self.sizes > 1 else "")
        if time_change(self.ratio) == "the same time":
            return said
        if not self.judged:
            return f"{said}, {'faster' if self.ratio < 1 else 'slower'} in one round (not judged)"
        if self.tone == "same":
            return f"{said}, inside the rounds' spread (no real difference on the whole)"
        return f"{said}, {self.tone}" + (" on the whole" if self.faster and self.slower else "")


@dataclass
class Headline:
    title: str
    best: str  # the rxelab algorithm(s) that won, and where
    rivals: list[Rival] = field(default_factory=list)
    words: str = ""  # with no rival: how the algorithms stand
    who: str = OURS


def _ours_name(r: Row) -> str:
    """One of rxelab's series as the headline says it: its algorithm, and the variant where it
    is one (ring (rxelab over tcp))."""
    k = f" k={r.pairs}" if (r.pairs or 1) > 1 else ""
    return r.algorithm + k + ("" if r.contender == "rxelab" else f" ({contender_title(r.contender)})")


def _geo(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def headlines(flat: list[Row], shared: set[str]) -> list[Headline]:
    """Per setting on a clean network: the best rxelab algorithm at each size against each
    other contender's best there."""
    out = []
    timed = [r for r in flat if r.status == "ok" and r.avg_us > 0 and spread(r)[0] > 0]
    for key, rs in settings(timed).items():
        if dict(zip(SETTING, key, strict=True))["network"] not in ("none", None):
            continue
        ours = [r for r in rs if ours_(r)]
        if not ours:
            continue
        sizes = sorted({r.size for r in ours})
        best = {s: min((r for r in ours if r.size == s), key=lambda r: r.avg_us) for s in sizes}
        wins: dict[str, list[int]] = defaultdict(list)
        for s, r in best.items():
            wins[_ours_name(r)].append(s)
        who = "; ".join(f"{name} at {_sizes(ss, len(sizes))}"
                        for name, ss in sorted(wins.items(), key=lambda kv: -len(kv[1])))
        h = Headline(setting_title(key, shared), who)
        for rival in sorted({r.contender for r in rs if not ours_(r)}):
            pairs = []
            for s in sizes:
                theirs = [r for r in rs if r.contender == rival and r.size == s]
                if theirs:
                    pairs.append((s, best[s], min(theirs, key=lambda r: r.avg_us)))
            if pairs:
                h.rivals.append(_rival(rival, pairs))
        if not h.rivals:
            h.words = _alone(ours, sizes)
        out.append(h)
    return out


def _rival(name: str, pairs: list[tuple[int, Row, Row]]) -> Rival:
    """Our best over theirs at each size; a size counts as won or lost only where the ratio
    stays on one side of 1 from our fastest round over their slowest to our slowest over their
    fastest, and is judged only where both ran in several rounds."""
    ratios, lows, highs, faster, slower, judged = [], [], [], 0, 0, 0
    for _, mine, theirs in pairs:
        (mlo, mhi), (tlo, thi) = spread(mine), spread(theirs)
        ratios.append(mine.avg_us / theirs.avg_us)
        lows.append(mlo / thi)
        highs.append(mhi / tlo)
        if mine.rounds > 1 and theirs.rounds > 1:
            judged += 1
            faster += highs[-1] < 1
            slower += lows[-1] > 1
    rival = Rival(name, _geo(ratios), _geo(lows), _geo(highs), len(pairs), faster, slower, judged)
    n = len(pairs)
    if n == 1:
        where = f"at {size_text(pairs[0][0])}"
    else:
        k_lo = min(range(n), key=ratios.__getitem__)
        k_hi = max(range(n), key=ratios.__getitem__)
        where = (f"from {ratios[k_lo]:.2f}x at "
                 f"{size_text(pairs[k_lo][0])} to {ratios[k_hi]:.2f}x at {size_text(pairs[k_hi][0])}")
    if not judged:
        verdict = "one round: no spread to judge by"
    else:
        inside = judged - faster - slower
        parts = [f"faster beyond the rounds' spread at {faster} of {n}" if faster else "",
                 f"slower beyond the rounds' spread at {slower} of {n}" if slower else "",
                 f"inside the rounds' spread (no real difference) at {inside} of {n}"
                 if inside else "",
                 f"one round, not judged, at {n - judged} of {n}" if judged < n else ""]
        verdict = "; ".join(p for p in parts if p) + (f" (rounds: {rival.low:.2f}x-"
                                                      f"{rival.high:.2f}x)")
    rival.words = f"{where}; {verdict}"
    return rival


def _alone(ours: list[Row], sizes: list[int]) -> str:
    """With nothing to compare with: the best rxelab algorithm against the runner-up."""
    parts = []
    for s in sizes:
        here = sorted((r for r in ours if r.size == s), key=lambda r: r.avg_us)
        if len(here) < 2:
            continue
        first, second = here[0], here[1]
        parts.append(f"{size_text(s)}: {_ours_name(first)} {second.avg_us / first.avg_us:.2f}x "
                     f"faster than {_ours_name(second)}"
                     + (" (inside the spread)" if overlap(first, second) else ""))
    return "; ".join(parts) or "one algorithm only"


def _sizes(ss: list[int], total: int) -> str:
    if len(ss) == total and total > 1:
        return "every size"
    return ", ".join(size_text(s) for s in ss)
