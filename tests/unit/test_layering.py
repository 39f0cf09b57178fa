"""The library's layout keeps its promises (issue 29): no module imports one that imports it
back (elastic membership sits below the communicator, forming below the control plane);
pyverbs is imported by rxelab.verbs alone, so the algorithms, Call and the engine's message
formats import on a host without it (what a recording engine and the simulator need)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from infra.config import REPO

LIB = REPO / "lib"


def _module(path: Path) -> str:
    parts = list(path.relative_to(LIB).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every rxelab module the file imports, TYPE_CHECKING blocks and function bodies too."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in modules else node.module)
    return {m for m in out if m in modules}


def graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in (LIB / "rxelab").rglob("*.py")}
    modules = set(files)
    edges = {m: _imports(p, modules) - {m} for m, p in files.items()}
    # a package's own __init__ is imported with any of its modules: not a cycle of theirs
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in edges.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                found.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2
    for m in sorted(edges):
        if m not in state:
            visit(m)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_library_imports_one_that_imports_it_back():
    assert cycles(graph()) == []


def test_the_communicator_is_above_membership_and_membership_knows_nothing_of_it():
    edges = graph()
    assert "rxelab.membership" in edges["rxelab.comm.communicator"]
    below = {m for m in edges if m.startswith("rxelab.membership")}
    assert not any(t.startswith("rxelab.comm") for m in below for t in edges[m])


def test_pyverbs_is_imported_by_rxelab_verbs_alone():
    importers = []
    for path in (LIB / "rxelab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "pyverbs" or n.startswith("pyverbs.") for n in names):
                importers.append(_module(path))
    assert set(importers) == {"rxelab.verbs"}


def test_the_algorithms_engine_and_communicator_import_without_pyverbs():
    code = ("import sys, pkgutil, importlib, rxelab.collectives as c\n"
            "for m in pkgutil.iter_modules(c.__path__):\n"
            "    importlib.import_module('rxelab.collectives.' + m.name)\n"
            "import rxelab.messages, rxelab.ops, rxelab.layouts, rxelab.schedules, rxelab.waits\n"
            "import rxelab.engine, rxelab.comm, rxelab.transports\n"
            "from rxelab.collectives.common import Call\n"
            "assert 'pyverbs' not in sys.modules, sorted(sys.modules)\n"
            "print('ok')\n")
    # only the library on the path: the test suite's fake pyverbs is not there
    r = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {[str(LIB)]!r}; "
                        "import site; site.main()\n" + code],
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
