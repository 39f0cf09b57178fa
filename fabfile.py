"""rxelab experiments over SSH (Fabric 3). Reads the lab's inventory (or INVENTORY=/--inventory
for machines you already have); the logic lives in experiments/, these tasks are its doors.

    fab deploy                         # lib/ and apps/ on every node; says what a node lacks
    fab run-experiment [--spec smoke]  # deploy if needed, run a spec, collect results/, report
    fab report [--run DIR]             # HTML + Markdown report of the newest (or given) run
    fab simulate [--spec smoke]        # SimGrid predictions beyond the lab's size
    fab calibrate                      # measure the lab: the simulator's cost profile
    fab validate [--run DIR]           # a lab run's cases predicted beside what the lab took
    fab compare --before DIR [--after DIR]  # rxelab over the MPIs: did a ratio move?
    fab status                         # the nodes, their RDMA port state

A flag means one thing in every task: --results is the directory the runs are in (each run
writes one directory there; a task that reads a run takes the newest there), --run is one
run's directory, --profile a cost profile, --spec the spec the task runs.

Every `fab` command imports this file, `fab --list` included: a task imports what it uses
(matplotlib, the simulator, the spec's models, the SSH fleet) in its own body, so listing the
tasks costs only Fabric's own start (tests/unit/test_fab_startup.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from fabric import task
from invoke.exceptions import Exit

from experiments import did_you_mean
from experiments.running.task_errors import one_line_errors
from infra.config import REPO

if TYPE_CHECKING:
    from infra.inventory import Inventory

RESULTS = REPO / "results"
SPECS = REPO / "experiments" / "specs"  # experiments.spec.SPECS, without loading the spec's models
# Flags renamed in issue 59 (one meaning per flag name): the old spelling names the new one.
RENAMED = {("calibrate", "--name"): "--profile", ("calibrate", "-n"): "-p (--profile)",
           ("calibrate", "--measured"): "--run", ("calibrate", "-m"): "-u (--run)",
           ("compare", "-a"): "--after"}
did_you_mean.install_task_hints(RENAMED)  # "fab run-experimnt": Invoke's error names the closest task
ACCEPT_NEW = ("trust SSH host keys of hosts seen for the first time and remember them "
              "(RXELAB_ACCEPT_NEW_HOST_KEYS=1); a changed key is always refused")
INVENTORY = "inventory file (default: the lab's)"
RESULTS_DIR = "the directory the runs are in: a run writes its own directory there, a task "\
    "that reads a run takes the newest there (default: results/)"


def _results_root(results: str | None) -> Path:
    """--results, checked: a run's own directory given there is --run's (it was the same flag
    in `fab report` and `fab validate` before issue 59), said in one line."""
    if not results:
        return RESULTS
    root = Path(results)
    if (root / "records.jsonl").is_file():
        raise Exit(f"error: --results {results} is one run's directory: name it with --run "
                   f"{results} (--results is the directory the runs are in)", code=1)
    return root


def _inventory(path: str | None, accept_new_host_keys: bool = False) -> tuple[
        Inventory, Path | None]:
    from infra import inventory as inventory_mod
    from infra.config import default_state_dir
    from infra.errors import LabError
    from infra.ssh import accept_new_host_keys as accept_new

    if accept_new_host_keys:  # read by every SSH connection this process makes
        os.environ["RXELAB_ACCEPT_NEW_HOST_KEYS"] = "1"
    chosen = path or os.environ.get("INVENTORY")
    try:
        accept_new()  # a bad value is said here, once, not in every connection's thread
        lab_state: Path | None = None
        if chosen:
            where = Path(chosen)
        else:
            lab_state = default_state_dir()
            where = lab_state / "inventory.json"
        inv = inventory_mod.load(where)
    except LabError as err:
        raise Exit(f"error: {err}", code=1) from None
    return inv, lab_state


def _deploy(inv: Inventory, hosts: list | None = None) -> None:
    from experiments.running import deploy as deploy_mod
    from experiments.running import fleet

    try:
        checks = deploy_mod.deploy(inv, hosts, say=lambda line: print(f"  {line}", flush=True))
    except fleet.FleetError as err:
        raise Exit(f"error: {err}", code=1) from None
    for c in checks:
        print(f"{c.host}: {'deployed' if c.deployed else 'up to date'}, ready")


@task(help={"inventory": INVENTORY, "accept_new_host_keys": ACCEPT_NEW})
@one_line_errors
def deploy(c, inventory=None, accept_new_host_keys=False):
    """Install rxelab and its apps on every node, and check what they need.

    Puts lib/ and apps/ in ~/rxelab on every node (idempotent) and checks Python, numpy,
    pyverbs and the RDMA device."""
    inv, _ = _inventory(inventory, accept_new_host_keys)
    _deploy(inv)


def _interrupt(signum, frame):
    from infra import run as runner_mod

    if signum == signal.SIGHUP:  # the terminal is gone: a write to it would fail mid-clean-up
        runner_mod.detach_from_terminal()
    raise KeyboardInterrupt


@task(help={"spec": "a shipped spec (" + ", ".join(sorted(p.stem for p in SPECS.glob("*.toml")))
                    + ") or a .toml path",
            "inventory": INVENTORY,
            "results": RESULTS_DIR,
            "launcher": "how the ranks start: ssh (ours, mpirun) or srun (Slurm); default: the spec's",
            "accept_new_host_keys": ACCEPT_NEW,
            "no_report": "do not write report.html/report.md at the end (`fab report` can later)"})
@one_line_errors
def run_experiment(c, spec="smoke", inventory=None, results=None, launcher=None,
                   accept_new_host_keys=False, no_report=False):
    """Run a spec on the nodes (deploying first), keep its results and write its report."""
    _run_spec(spec, inventory, results, launcher, accept_new_host_keys, not no_report)


def _write_report(out: Path) -> bool:
    """The run's report, said where it is; a report that cannot be written loses no result."""
    from experiments import report as report_mod

    try:
        html_path, md_path = report_mod.write(out)
    except Exception as err:
        print(f"error: the report was not written ({err}); the results are kept: "
              f"`fab report --run {out}` tries again")
        return False
    print(f"report: {html_path}\n        {md_path}")
    return True


def _run_spec(spec: str, inventory: str | None, results: str | None, launcher: str | None,
              accept_new_host_keys: bool, write_report: bool = False) -> Path:
    """run-experiment's work: the run's directory, or Exit with what went wrong."""
    import paramiko
    from invoke.exceptions import CommandTimedOut

    from experiments import report as report_mod
    from experiments import spec as spec_mod
    from experiments.report import verdict
    from experiments.running import about, fleet, progress, runner
    from infra.state import LabState

    root = _results_root(results)
    # `kill` or a closed terminal ends a run as Ctrl-C does: partial results kept, the nodes
    # cleaned up (otherwise the remote ranks would run on until their own deadline)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        chosen = spec_mod.load(spec)
    except spec_mod.SpecError as err:
        raise Exit(f"error: {err}", code=1) from None
    if launcher is not None and launcher not in spec_mod.LAUNCHERS:
        raise Exit(f"error: --launcher {launcher!r}: must be one of {', '.join(spec_mod.LAUNCHERS)}",
                   code=1)
    problem = spec_mod.launcher_problem(chosen, launcher or chosen.launcher)
    if problem:
        raise Exit(f"error: {problem}", code=1)
    inv, lab_state = _inventory(inventory, accept_new_host_keys)
    if chosen.max_nodes > len(inv.hosts):
        raise Exit(f"error: spec {chosen.name} needs {chosen.max_nodes} nodes, the inventory has "
                   f"{len(inv.hosts)}", code=1)
    _deploy(inv, list(inv.hosts[:chosen.max_nodes]))
    try:
        env = about.environment(list(inv.hosts[:chosen.max_nodes]), lab_state)
        lab = LabState(lab_state) if lab_state else None
        lab_mtu = lab.load_config().mtu if lab and lab.config_file.exists() else None
        run = runner.Runner(chosen, inv, root, lab_mtu=lab_mtu,
                            launcher=launcher, progress=progress.for_terminal)
        print(f"{chosen.name}: " + ("an elastic scenario" if chosen.elastic else
                                    "a DDP scenario" if chosen.ddp else
                                    f"{len(chosen.cases())} cases") + f" -> {run.dir}")
        out = run.run(env)
    except KeyboardInterrupt:
        raise Exit("interrupted: partial results kept (marked incomplete); nothing left running",
                   code=130) from None
    except fleet.FleetError as err:
        raise Exit(f"error: {err}", code=1) from None
    except (paramiko.SSHException, ConnectionError, EOFError, TimeoutError, CommandTimedOut) as err:
        raise Exit(f"error: lost a node over SSH: {err}; partial results are kept", code=1) from None
    except OSError as err:  # e.g. a full disk while writing the results
        raise Exit(f"error: {err}; partial results are kept", code=1) from None
    records = report_mod.load(out)[1]
    if write_report:
        _write_report(out)
    judged = verdict.of_run(chosen, out, records)
    for line in judged.said:
        print(line)
    if judged.failure:
        raise Exit(judged.failure, code=1)
    return out


@task(help={"results": RESULTS_DIR,
            "run": "the run to report: its directory (default: the newest under --results)"})
@one_line_errors
def report(c, results=None, run=None):
    """Write report.html and report.md (with plots) of a run."""
    if run:
        chosen = Path(run)
    else:
        root = _results_root(results)
        runs = sorted(p for p in root.glob("*") if (p / "records.jsonl").exists())
        if not runs:
            raise Exit(f"error: no results under {root} yet: run `fab run-experiment` first",
                       code=1)
        chosen = runs[-1]
    if not (chosen / "records.jsonl").exists():
        raise Exit(f"error: {chosen} is not a results directory", code=1)
    if not _write_report(chosen):
        raise Exit(code=1)


# No short flags: -a and -b are --accept-new-host-keys and --beside elsewhere.
@task(help={"before": "the earlier run's directory",
            "after": "the later run's directory (default: the newest in results/)"},
      auto_shortflags=False)
@one_line_errors
def compare(c, before, after=None):
    """Compare rxelab's time over MPI's in two runs of one spec, round by round.

    Exits 1 when a ratio got slower beyond the rounds' spread (the `regression` spec is made
    for it)."""
    from experiments.report import compare_runs

    later = Path(after) if after else None
    if later is None:
        runs = sorted(p for p in RESULTS.glob("*") if (p / "records.jsonl").exists())
        if not runs:
            raise Exit("error: no results yet: run `fab run-experiment` first", code=1)
        later = runs[-1]
    try:
        changes = compare_runs.compare(Path(before), later)
    except compare_runs.CompareError as err:
        raise Exit(f"error: {err}", code=1) from None
    print(compare_runs.table(changes, Path(before), later))
    slower = [ch for ch in changes if ch.verdict == "slower"]
    if slower:
        raise Exit("slower beyond the rounds' spread: " + "; ".join(
            f"{ch.case.label()} {ch.before.median:.2f}x -> {ch.after.median:.2f}x" for ch in slower),
            code=1)


@task(help={"spec": "a simulation spec: a name from experiments/simulations/ or a .toml path",
            "results": RESULTS_DIR})
@one_line_errors
def simulate(c, spec="smoke", results=None):
    """Predict collectives beyond the lab's size with SimGrid (no lab needed).

    Runs rxelab's own schedules and SMPI's MPI algorithms on SimGrid platforms."""
    from experiments.simulation import costs as sim_costs
    from experiments.simulation import replayer as sim_replayer
    from experiments.simulation import run as sim_run
    from experiments.simulation import spec as sim_spec

    root = _results_root(results)
    try:
        chosen = sim_spec.load(spec)
        out = sim_run.write(chosen, root)
    except (sim_spec.SpecError, sim_costs.ProfileError, sim_replayer.SimulationError) as err:
        raise Exit(f"error: {err}", code=1) from None
    except KeyboardInterrupt:
        raise Exit("interrupted: the rows so far are kept", code=130) from None
    failed = sim_run.failures(out)
    print(f"results: {out}" + (f" ({len(failed)} cases failed)" if failed else ""))
    if failed:
        raise Exit("; ".join(failed[:3]), code=1)


# results before run: -r is --results in every task, --run takes -u
@task(help={"results": RESULTS_DIR,
            "run": "fit an earlier calibrate run (its directory) instead of running one",
            "profile": "the profile to write, by name: results/profiles/NAME.json (default: lab)",
            "inventory": INVENTORY,
            "accept_new_host_keys": ACCEPT_NEW})
@one_line_errors
def calibrate(c, results=None, run=None, profile="lab", inventory=None,
              accept_new_host_keys=False):
    """Measure the lab's costs for the simulator (about 13 minutes).

    Runs the calibrate spec and writes the cost profile a simulation spec names."""
    from experiments.simulation import calibrate as sim_calibrate
    from experiments.simulation import replayer as sim_replayer
    from experiments.simulation import spec as sim_spec

    try:
        path = sim_spec.profile_path(sim_calibrate.check_name(profile))
        if run is None:
            out = _run_spec(sim_calibrate.SPEC, inventory, results, None, accept_new_host_keys)
        else:
            out = Path(run)
        fitted = sim_calibrate.fit_run(out, profile)
        sim_calibrate.save(fitted, path)
    except (sim_calibrate.CalibrationError, sim_replayer.SimulationError) as err:
        raise Exit(f"error: {err}", code=1) from None
    for line in sim_calibrate.describe(fitted):
        print(line)
    print(f"profile: {path} (name it in a simulation spec: profile = \"{profile}\")")


# results before run: -r is --results in every task, --run takes -u
@task(help={"results": RESULTS_DIR,
            "run": "the lab run to validate: its directory (default: the newest under --results "
                   "with rxelab calls back to back)",
            "profile": "a calibrated profile's name or .json path (default: the one fitted "
                       "on the run's own calibration cases, else lab)",
            "beside": "another lab run's directory, scored as a prediction too: the lab "
                      "against itself (default: the newest run of the same spec before it, else "
                      "the first after it)"})
@one_line_errors
def validate(c, results=None, run=None, profile=None, beside=None):
    """Set the simulator's predictions beside what a lab run took.

    Predicts every rxelab case of a lab run (calls back to back) from a calibrated profile,
    without refitting, beside the lab's medians and spread (validation.md in the run's
    directory), and another run of the same cases the same way, as the lab's own yardstick."""
    from experiments.simulation import costs as sim_costs
    from experiments.simulation import replayer as sim_replayer
    from experiments.simulation import spec as sim_spec
    from experiments.simulation import validate as sim_validate

    try:
        chosen = (sim_validate.named_run(Path(run)) if run
                  else sim_validate.newest(_results_root(results)))
        other = Path(beside) if beside else None
        try:
            lab_run = other is None or (other / "records.jsonl").is_file()
        except OSError as err:
            raise sim_validate.CannotValidate(f"--beside {beside}: {err}") from None
        if not lab_run:
            raise sim_validate.CannotValidate(f"--beside {beside}: not a lab run's directory "
                                               "(no records.jsonl)")
        used = (sim_costs.load(sim_spec.profile_path(profile)) if profile is not None
                else sim_validate.own_profile(chosen)
                or sim_costs.load(sim_spec.profile_path("lab")))
        out = sim_validate.write(chosen, used, other)
    except (sim_validate.CannotValidate, sim_costs.ProfileError,
            sim_replayer.SimulationError) as err:
        raise Exit(f"error: {err}", code=1) from None
    print(out.read_text())
    print(f"validation: {out}")


@task(help={"inventory": INVENTORY, "accept_new_host_keys": ACCEPT_NEW})
@one_line_errors
def status(c, inventory=None, accept_new_host_keys=False):
    """Show the inventory's nodes and their RDMA port state."""
    from infra import status as status_mod

    inv, _ = _inventory(inventory, accept_new_host_keys)
    status_mod.show(status_mod.collect(inv))
