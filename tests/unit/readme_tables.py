"""The README's "when things go wrong" tables whose last column names the tests that hold each
row: a row is a contract only while those tests exist."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def missing_tests(heading: str, at_least: int) -> list[str]:
    """What is wrong with the table under `heading`: rows naming no test, tests that do not
    exist, or fewer rows than `at_least`."""
    text = (REPO / "README.md").read_text()
    table = text.split(heading, 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    problems = [] if len(rows) >= at_least else [f"{len(rows)} rows, expected {at_least}"]
    sources = "".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    for row in rows:
        names = re.findall(r"`(test_\w+)`", row.rsplit("|", 2)[1])
        problems += [] if names else [f"no test named: {row[:60]}"]
        problems += [name for name in names if f"def {name}(" not in sources]
    return problems
