"""ARCHITECTURE.md stays true (issue 57): its arrows are exactly the imports between rooms, in
every folder of the code, not only the library's; every module is named in its room's row or
in the docstring of a package the row names; and each "where is ..." answer names at most
three files, each of which exists. Before, the page drew an arrow no import made, left out
two that 29 imports made, and missed whole packages."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from infra.config import REPO

PAGE = REPO / "ARCHITECTURE.md"
CODE = ("fabfile.py", "apps", "infra", "experiments", "lib/rxelab")
OURS = {"rxelab", "infra", "experiments", "apps", "fabfile"}
QUESTIONS = ("where is a dead rank reported?", "where is the MTU set?",
             "how does a result reach the report?", "how do I add a collective?",
             "where is a shrink decided?")


def section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def rows(title: str) -> dict[str, str]:
    """A table of the page as {first cell's backticked name: the rest of the row}."""
    out = {}
    for line in section(title).splitlines():
        if m := re.match(r"\| `([^`]+)` \|(.*)\|$", line):
            out[m.group(1).rstrip("/")] = m.group(2)
    return out


def code_files() -> list[Path]:
    files = []
    for top in CODE:
        base = REPO / top
        files += [base] if base.is_file() else sorted(base.rglob("*.py"))
    return files


def room_of_path(path: Path) -> str:
    rel = path.relative_to(REPO).as_posix()
    parts = rel.split("/")
    if parts[0] == "lib":
        return "lib/rxelab"
    if parts[0] == "experiments":
        return rel if len(parts) == 2 else "/".join(parts[:2])
    return parts[0]


def room_of_module(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "rxelab":
        return "lib/rxelab"
    if parts[0] == "fabfile":
        return "fabfile.py"
    if parts[0] == "experiments" and len(parts) > 1:
        leaf = REPO / "experiments" / f"{parts[1]}.py"
        return f"experiments/{parts[1]}.py" if leaf.exists() else f"experiments/{parts[1]}"
    return parts[0]


def imported(path: Path) -> set[str]:
    """Every module of ours the file imports: function bodies and TYPE_CHECKING blocks too."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from experiments import report`: the module is the name imported
            out.update(f"{node.module}.{a.name}" if node.module == "experiments" else node.module
                       for a in node.names)
    return {m for m in out if m.split(".")[0] in OURS}


def room_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in code_files():
        if path == REPO / "experiments" / "__init__.py":  # the rooms' package: a docstring
            assert not imported(path)
            continue
        src = room_of_path(path)
        edges.setdefault(src, set())
        edges[src] |= {room_of_module(m) for m in imported(path)} - {src}
    return edges


def drawn() -> dict[str, set[str]]:
    return {room: set(re.findall(r"`([^`]+)`", rest)) for room, rest in rows("The arrows").items()}


def test_the_page_draws_exactly_the_arrows_the_imports_make():
    found, page = room_edges(), drawn()
    assert set(found) == set(page), "a room of the code is missing from the arrows, or one is stale"
    for room in found:
        assert found[room] <= page[room], f"{room} imports {found[room] - page[room]}: not on the page"
        assert page[room] <= found[room], f"{room} -> {page[room] - found[room]}: no import makes it"


def test_the_arrows_point_one_way():
    edges, seen = drawn(), set()

    def down(room: str, path: tuple[str, ...]) -> None:
        assert room not in path, f"the arrows go round: {' -> '.join((*path, room))}"
        if room not in seen:
            for to in edges.get(room, ()):
                down(to, (*path, room))
            seen.add(room)
    for room in edges:
        down(room, ())


def test_the_arrow_checker_sees_an_import_the_page_does_not_draw(tmp_path, monkeypatch):
    """The check can fail: an import of infra from apps, which the page does not draw."""
    monkeypatch.setattr(f"{__name__}.imported",
                        lambda p: {"infra.config"} if p.name == "stages.py" else set())
    assert "infra" in room_edges()["apps"] and "infra" not in drawn()["apps"]


def package_names(package: Path) -> set[str]:
    init = package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) if init.exists() else None
    return set(re.findall(r"`([a-z_]+)`", doc or ""))


def modules_in_rooms() -> list[Path]:
    """The modules a room's row must name: a package's opening is the room itself, and the
    fabfile and any module that is a room of its own have their own row."""
    rooms = rows("The rooms")
    return [p for p in code_files()
            if p.name not in {"__init__.py", "fabfile.py"}
            and p.relative_to(REPO).as_posix() not in rooms]


def test_the_module_list_leaves_out_only_what_it_says():
    kept = modules_in_rooms()
    assert len(kept) > 100
    assert not {p.name for p in kept} & {"__init__.py", "fabfile.py"}


@pytest.mark.parametrize("path", modules_in_rooms(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_module_is_named_in_its_rooms_row(path):
    rooms = rows("The rooms")
    folder = path.parent.relative_to(REPO).as_posix()
    row = rooms.get(folder)
    assert row is not None, f"{folder}/ has no row in the page's rooms"
    named = set(re.findall(r"`([^`]+)`", row))
    assert path.name in named or path.stem in package_names(path.parent), \
        f"{path.relative_to(REPO)} is named neither in its room's row nor in its package's docstring"


def answers() -> dict[str, str]:
    out = {}
    for line in section("Where each promise is kept").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 2 and cells[0].endswith("?"):
            out[cells[0]] = cells[1]
    return out


def files_named(answer: str) -> set[str]:
    return {p for p in re.findall(r"`([^`]+)`", answer) if "/" in p}


@pytest.mark.parametrize("question", QUESTIONS)
def test_each_question_is_answered_in_at_most_three_files_that_exist(question):
    answer = answers().get(question)
    assert answer is not None, f"the page does not answer {question!r}"
    named = files_named(answer)
    assert 1 <= len(named) <= 3, f"{question!r} takes {len(named)} files: {sorted(named)}"
    for name in named:
        assert (REPO / name).exists(), f"{question!r} names {name}, which does not exist"


def test_the_count_of_files_counts_paths_not_words():
    assert files_named("`a/b.py`, `c/`, `Reason`, `x/y.py` and `a/b.py` again") == {"a/b.py", "c/", "x/y.py"}


def words() -> dict[str, list[str]]:
    """The page's words: {name: the files its row names}."""
    out = {}
    for line in section("Words with one meaning").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and (m := re.fullmatch(r"`([A-Za-z_]+)`", cells[0])):
            out[m.group(1)] = re.findall(r"`([^`]+/[^`]+)`", cells[2])
    return out


def test_the_page_defines_the_words_that_had_two_meanings():
    rows_drawn = [ln for ln in section("Words with one meaning").splitlines()
                  if ln.startswith("| `")]
    assert len(rows_drawn) == len(words()), "a row of the words' table that the test cannot read"
    assert {"stages", "Call", "iterations", "seed_api", "mtu_enum", "Reason",
            "lab_settings"} <= set(words())


@pytest.mark.parametrize("word", sorted(words()))
def test_each_word_is_in_every_file_its_row_names(word):
    files = words()[word]
    assert files, f"the row of {word!r} names no file"
    for f in files:
        path = REPO / f
        assert path.is_file(), f"{word}: {f} does not exist"
        assert path.stem == word or re.search(rf"\b{word}\b", path.read_text()), \
            f"{word!r} is not in {f}"
