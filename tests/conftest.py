"""Shared fixtures. End-to-end tests share one lab for the whole session, provisioned with
the README's command (`make provision`) into a state directory of the test run's own, under a
lab name and SSH ports of its own, so a user's lab on the same machine is never touched."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

try:  # pytest-xdist, with the test tools (make test-deps); without it, tests run in one process
    from xdist.scheduler import LoadScopeScheduling
except ImportError:
    LoadScopeScheduling = None

from infra import inventory as inventory_mod
from infra import lab as lab_mod
from infra import run as runner
from infra.config import REPO, Image, LabConfig
from infra.inventory import Host, Inventory
from infra.ssh import ssh_argv
from infra.state import LabState
from tests import cpu_hogs, lab_sessions, terminate, tofu_standin

# tests/torch runs under the distribution's torch, in .venv-torch (the Makefile's second run)
collect_ignore = [] if importlib.util.find_spec("torch") else ["torch"]

PROVISION_TIMEOUT_S = 1800
DESTROY_TIMEOUT_S = 600


@dataclass
class Lab:
    env: dict[str, str]
    state: LabState
    config: LabConfig
    inventory: Inventory
    qemu_pids: dict[str, int]
    borrowed: bool = False  # RXELAB_TEST_STATE: a developer's running lab
    # how the lab came up beside CPU hogs: hogs, seconds of provision and deploy, hogs' CPU
    busy: dict[str, float] = field(default_factory=dict)

    @property
    def hosts(self) -> tuple[Host, ...]:
        return self.inventory.hosts

    def ssh(self, node: str | Host, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        host = node if isinstance(node, Host) else self.inventory.host(node)
        try:
            return subprocess.run(ssh_argv(host, command), capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{host.name}: `{command}` did not finish within {timeout} s")

    def try_ssh(self, node: str | Host, command: str, timeout: float = 60) -> str | None:
        """For polling a node that may be down: its output, or None if it did not answer."""
        host = node if isinstance(node, Host) else self.inventory.host(node)
        try:
            r = subprocess.run(ssh_argv(host, command), capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None
        return r.stdout if r.returncode == 0 else None

    def fab(self, task: str, timeout: float, log: Path) -> subprocess.CompletedProcess[str]:
        """A fab task as the README runs it (.venv/bin/fab), on this lab's inventory."""
        env = {**self.env, "INVENTORY": str(self.state.inventory_file)}
        with log.open("w") as out:
            r = subprocess.run([str(REPO / ".venv" / "bin" / "fab"), task], cwd=REPO, env=env,
                               stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        return subprocess.CompletedProcess(r.args, r.returncode, log.read_text(), "")

    def make(self, target: str, timeout: float, log: Path) -> subprocess.CompletedProcess[str]:
        if target == "destroy":
            keep_guest_logs(self.state, log.parent / "guest-logs")
        with log.open("w") as out:
            proc = subprocess.Popen(["make", target], cwd=REPO, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                pytest.fail(f"`make {target}` did not finish within {timeout} s; log: {log}")
            except BaseException:  # the session stops (tests/terminate.py): so does the target,
                if target != "destroy":  # but a destroy, the clean-up itself, goes on to its end
                    terminate.stop_make(proc)
                raise
        return subprocess.CompletedProcess(["make", target], proc.returncode, log.read_text(), "")


OWN_LABS = "tests/e2e/test_provision_failures.py"  # short-lived labs of their own


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that destroy the shared lab run after every other test; the tests that boot labs of
    their own and need nothing of the shared one come after the unit tests."""
    items.sort(key=lambda item: (item.get_closest_marker("destroys_lab") is not None,
                                 item.nodeid.startswith(OWN_LABS)))


if LoadScopeScheduling is not None:
    class OneLabAtATime(LoadScopeScheduling):
        """Under `make test` (pytest -n 2): every test of the shared lab (tests/e2e) is one
        unit of work, sent whole and in order to one worker (the lab destroyed last), while
        the other worker runs the unit tests, which spend most of their time waiting on the
        fake fabric's deadlines, and then the provision-failure tests, whose labs live seconds.
        (xdist's --dist loadgroup would say the same with markers, but under pytest 9 it
        groups nothing.)"""

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith("tests/e2e/") and not nodeid.startswith(OWN_LABS):
                return "lab"
            return super()._split_scope(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> OneLabAtATime:
        return OneLabAtATime(config, log)


def yield_cpu(pid: int, niceness: int = 10) -> None:
    """Lower every thread of a process (qemu's vCPU threads among them): the lab's VMs then take
    only the CPU the unit tests beside them leave, and those keep the timing they have alone."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)
        except (ProcessLookupError, PermissionError):
            pass


def lab_image() -> str:
    """The image every lab of the session boots: RXELAB_TEST_IMAGE (debian-12, debian-13,
    ubuntu-24.04), else the default (`auto`) that CI's lab boots. The setting is the tests' own,
    so an IMAGE left in a developer's shell does not change what `make test` tests."""
    name = os.environ.get("RXELAB_TEST_IMAGE", Image.AUTO.value)
    try:
        return Image(name).value
    except ValueError:
        raise pytest.UsageError(f"RXELAB_TEST_IMAGE={name!r} is no image: one of "
                                f"{', '.join(i.value for i in Image)}") from None


def pytest_configure(config: pytest.Config) -> None:
    terminate.install()
    os.environ["IMAGE"] = lab_image()  # every lab a test provisions, the shared one and its own
    config.addinivalue_line("markers", "destroys_lab: runs last; tears the shared lab down")


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    existing = os.environ.get("RXELAB_TEST_STATE")
    if existing:  # a lab the developer already runs: use it, never destroy it
        state = LabState(Path(existing).resolve())
        config = state.load_config()
        yield Lab({**os.environ, "RXELAB_STATE": str(state.root)}, state, config,
                  inventory_mod.load(state.inventory_file),
                  {n.name: int(state.pidfile(n.name).read_text()) for n in config.all_nodes()},
                  borrowed=True)
        return
    root = tmp_path_factory.mktemp("lab")
    # OpenTofu, not Terraform, drives the shared lab: no `terraform` is on its PATH (issue 53).
    # OpenTofu is in no registry we reach, so a stand-in answers as `tofu` over the host's
    # Terraform (tests/tofu_standin.py) where no real one is installed.
    only_tofu = (tofu_standin.path_without("terraform", root / "bin") if shutil.which("tofu")
                 else tofu_standin.only_tofu_path(root / "bin", log=root / "tofu.log"))
    env = {**os.environ, "RXELAB_STATE": str(root / "state"), "LAB": "rxetest",
           "SSH_PORT_BASE": "2320", "NODES": "3", "PATH": only_tofu}
    reap_abandoned_labs(tmp_path_factory.getbasetemp(), root)
    state = LabState(root / "state")
    handle = Lab(env, state, None, None, {})  # type: ignore[arg-type]
    try:
        # The README's two commands, as a user runs them on a busy host (issue 53): beside
        # CPU hogs, twice as many as the host has cores (RXELAB_TEST_HOGS), with the defaults.
        with cpu_hogs.Hogs(cpu_hogs.default_count()) as hogs:
            started = time.monotonic()
            r = handle.make("provision", PROVISION_TIMEOUT_S, root / "provision.log")
            tail = "\n".join(r.stdout.splitlines()[-40:])
            assert r.returncode == 0, f"make provision beside {hogs.count} CPU hogs failed:\n{tail}"
            provisioned = time.monotonic() - started
            handle.config = state.load_config()
            handle.inventory = inventory_mod.load(state.inventory_file)
            d = handle.fab("deploy", PROVISION_TIMEOUT_S, root / "deploy.log")
            assert d.returncode == 0, f"fab deploy beside {hogs.count} CPU hogs failed:\n{d.stdout[-3000:]}"
            handle.busy = {"hogs": hogs.count, "provision_s": provisioned,
                           "deploy_s": time.monotonic() - started - provisioned,
                           "hog_cpu_s": min(hogs.cpu_seconds(), default=0.0)}
        print(f"\nlab provisioned in {provisioned:.0f} s and deployed in "
              f"{handle.busy['deploy_s']:.0f} s beside {hogs.count} CPU hogs")
        handle.qemu_pids = {n.name: int(state.pidfile(n.name).read_text())
                            for n in handle.config.all_nodes()}
        for pid in handle.qemu_pids.values():
            yield_cpu(pid)
        yield handle
    finally:
        if state.root.exists():
            handle.make("destroy", DESTROY_TIMEOUT_S, root / "destroy-finally.log")
        for pid in handle.qemu_pids.values():  # last resort: stop our own VMs by pid
            if runner.process_is(pid, "qemu-system-x86_64"):
                os.kill(pid, 9)
        if handle.config is not None and state.root.exists():
            lab_mod.teardown(state)


def keep_guest_logs(state: LabState, to: Path) -> None:
    """The guests' serial consoles outlive the lab (a destroy removes its state): what a node
    that hung or lost its network printed last is there and nowhere else. A copy that fails
    is said and stops nothing: the destroy after it must run."""
    try:
        if not state.logs.is_dir():
            return
        to.mkdir(mode=0o700, exist_ok=True)  # like the lab's own directory
        for log in state.logs.glob("*.serial.log"):
            shutil.copy2(log, to / log.name)
    except OSError as err:
        print(f"\nthe guests' serial logs were not kept: {err}")
        return
    print(f"\nthe guests' serial logs: {to}")


@pytest.fixture(scope="session", autouse=True)
def session_lock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """While this test process lives, its labs are its own (tests/lab_sessions.py)."""
    with lab_sessions.hold(tmp_path_factory.getbasetemp()):
        yield


def reap_abandoned_labs(basetemp: Path, own: Path) -> None:
    """Destroy, each from its own state directory, the labs of test sessions that were killed
    before they could (see tests/lab_sessions.py)."""
    root = lab_sessions.sessions_root(basetemp)
    for n, state_dir in enumerate(lab_sessions.abandoned(root, basetemp) if root else []):
        log = own / f"reap-{n}.log"
        r = Lab({**os.environ, "RXELAB_STATE": str(state_dir)}, LabState(state_dir), None, None,  # type: ignore[arg-type]
                {}).make("destroy", DESTROY_TIMEOUT_S, log)
        print(f"\nthe lab of an ended test session ({state_dir}) destroyed: exit {r.returncode}, "
              f"log {log}")
