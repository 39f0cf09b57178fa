"""`fab --list` and `fab --help TASK` load only the fabfile's doors (issue 59): a newcomer's first
command took 1.8 to 6 s because the fabfile imported matplotlib, the report, the simulator and
the spec's models up front. Each task now imports what it uses in its own body. Not a timed test:
what is loaded is checked, the seconds are measured with `farm-bench -- fab --list`.

paramiko is not in the list: Fabric itself imports it (fabric/connection.py) before it reads
the fabfile, so no fabfile can spare it; the modules of ours that use it (infra.ssh, the fleet)
are in the list."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fabfile

REPO = Path(__file__).resolve().parents[2]
# What listing the tasks must not load: the heavy libraries and the rooms that import them.
HEAVY = ("matplotlib", "numpy", "pydantic", "jinja2", "rich", "experiments.report",
         "experiments.simulation", "experiments.spec", "experiments.running.fleet",
         "experiments.running.runner", "infra.inventory", "infra.ssh", "rxelab")
# fab's own program, run in a fresh interpreter: what it printed and every module it loaded.
PROBE = """
import contextlib, io, json, sys
from fabric.main import program
said = {}
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        program.run(["fab", *argv], exit=False)
    said[" ".join(argv)] = out.getvalue()
print(json.dumps({"said": said, "modules": sorted(sys.modules)}))
"""


def tasks() -> list[str]:
    """Every task as fab names it (Invoke dashes the underscores of a function's name)."""
    return sorted(t.name.replace("_", "-") for t in vars(fabfile).values()
                  if type(t).__name__ == "Task")


def probe(*argvs: list[str]) -> tuple[dict[str, str], set[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    return found["said"], set(found["modules"])


def loaded(modules: set[str], name: str) -> bool:
    return name in modules or any(m.startswith(name + ".") for m in modules)


def test_fab_list_and_help_list_every_task_without_loading_what_the_tasks_use():
    names = tasks()
    assert len(names) >= 8
    said, modules = probe(["--list"], *(["--help", name] for name in names))
    listed = said["--list"].split()
    assert [n for n in names if n not in listed] == []
    for name in names:
        assert f"fab [--core-opts] {name}" in said[f"--help {name}"], name
    assert "--run=STRING" in said["--help calibrate"] and "--run=STRING" in said["--help report"]
    assert "fabfile" in modules, "the probe read the fabfile"
    assert [m for m in HEAVY if loaded(modules, m)] == []


def test_the_probe_sees_a_heavy_module_when_one_is_loaded(tmp_path):
    """The check can fail: a task run through the same probe (status, on an inventory that is
    not there: refused before any node is asked) loads the inventory's pydantic models."""
    said, modules = probe(["status", "--inventory", str(tmp_path / "none.json")])
    assert said == {f"status --inventory {tmp_path / 'none.json'}": ""}
    assert loaded(modules, "infra.inventory") and loaded(modules, "pydantic")


def test_the_fabfile_names_the_shipped_specs_where_the_spec_loader_finds_them():
    from experiments import spec

    assert fabfile.SPECS == spec.SPECS
