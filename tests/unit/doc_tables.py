"""The documentation's "when things go wrong" tables whose last column names the tests that
hold each row (docs/troubleshooting.md): a row is a contract only while those tests exist."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"


def table_under(heading: str, page: Path = TROUBLESHOOTING) -> list[str]:
    """The rows of the first table after `heading` (a whole line of the page), header left out."""
    lines = page.read_text().splitlines()
    if heading not in lines:
        raise LookupError(f"{page.relative_to(REPO)} has no heading {heading!r}")
    rows: list[str] = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("| "):
            rows.append(line)
        elif rows or line.startswith("#"):
            break
    return [row for row in rows if "---" not in row][1:]


def missing_tests(heading: str, at_least: int, page: Path = TROUBLESHOOTING) -> list[str]:
    """What is wrong with the table under `heading`: rows naming no test, tests that do not
    exist, or fewer rows than `at_least`."""
    rows = table_under(heading, page)
    problems = [] if len(rows) >= at_least else [f"{len(rows)} rows, expected {at_least}"]
    sources = "".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    for row in rows:
        names = re.findall(r"`(test_\w+)`", row.rsplit("|", 2)[1])
        problems += [] if names else [f"no test named: {row[:60]}"]
        problems += [name for name in names if f"def {name}(" not in sources]
    return problems
