"""A test session stopped by SIGTERM finalizes its fixtures (the shared lab among them), also
when a second SIGTERM comes during that teardown and under xdist's workers; a make target the
session waits for is stopped with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.config import REPO
from tests.terminate import stop_make

WAIT_S = 60

CONFTEST = """
from tests import terminate

def pytest_configure(config):
    terminate.install()
"""

SESSION = """
import os, subprocess, time
from pathlib import Path
import pytest

OUT = Path(os.environ["OUT"])

@pytest.fixture(scope="session")
def held():
    try:  # the mark inside: a SIGTERM that lands within touch() must still see a teardown
        (OUT / f"started-{os.getpid()}").touch()
        yield
    finally:
{teardown}

@pytest.mark.parametrize("n", range({tests}))
def test_waits(held, n):
    time.sleep(60)
"""

WAITED = """
        (OUT / f"tearing-{os.getpid()}").touch()
        deadline = time.monotonic() + {teardown_s}
        while time.monotonic() < deadline and not (OUT / "go-on").exists():
            time.sleep(0.05)
        (OUT / f"torn-down-{os.getpid()}").touch()
"""


def wait_for(out: Path, prefix: str, count: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while len(list(out.glob(f"{prefix}-*"))) < count:
        if proc.poll() is not None:
            pytest.fail(f"the session ended (exit {proc.returncode}) before {count} `{prefix}` "
                        f"files: {proc.communicate()[0][-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {count} `{prefix}` files within {WAIT_S} s")
        time.sleep(0.05)


def session(tmp_path: Path, *args: str, teardown_s: float = 0, tests: int = 1,
            install: bool = True, teardown: str = WAITED) -> tuple[subprocess.Popen[str], Path]:
    suite = tmp_path / "suite"
    out = tmp_path / "out"
    suite.mkdir()
    out.mkdir()
    (suite / "conftest.py").write_text(CONFTEST if install else "")
    (suite / "test_held.py").write_text(textwrap.dedent(SESSION).replace(
        "{teardown}", teardown.strip("\n")).replace("{teardown_s}", str(teardown_s)).replace(
        "{tests}", str(tests)))
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args,
                             str(suite)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, out


def ended(proc: subprocess.Popen[str]) -> int:
    try:
        return proc.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the session did not end within {WAIT_S} s of SIGTERM")


@pytest.fixture
def sessions() -> Iterator[list[subprocess.Popen[str]]]:
    """Sessions a test started, killed by their group if the test fails before they end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_sigterm_finalizes_the_session_fixtures(tmp_path: Path, sessions: list) -> None:
    proc, out = session(tmp_path)
    sessions.append(proc)
    wait_for(out, "started", 1, proc)
    proc.send_signal(signal.SIGTERM)
    assert ended(proc) == 2, proc.communicate()[0][-2000:]  # pytest's "interrupted"
    assert len(list(out.glob("torn-down-*"))) == 1


def test_without_the_handler_sigterm_leaves_the_fixtures_as_they_were(tmp_path: Path,
                                                                       sessions: list) -> None:
    """What the handler is for: Python's default ends the session with no teardown at all."""
    proc, out = session(tmp_path, install=False)
    sessions.append(proc)
    wait_for(out, "started", 1, proc)
    proc.send_signal(signal.SIGTERM)
    assert ended(proc) == -signal.SIGTERM
    assert not list(out.glob("tearing-*"))


@pytest.mark.slow
def test_a_second_sigterm_does_not_cut_the_teardown_short(tmp_path: Path, sessions: list) -> None:
    proc, out = session(tmp_path, teardown_s=WAIT_S)
    sessions.append(proc)
    wait_for(out, "started", 1, proc)
    proc.send_signal(signal.SIGTERM)
    wait_for(out, "tearing", 1, proc)
    proc.send_signal(signal.SIGTERM)
    (out / "go-on").touch()  # had the second one ended it, nothing would be torn down
    assert ended(proc) == 2
    assert len(list(out.glob("torn-down-*"))) == 1


DETACHED = """
        # as the lab's `make destroy`: a session of its own, waited for
        mark = OUT / f"torn-down-{os.getpid()}"
        proc = subprocess.Popen(["sh", "-c", f"sleep {DETACHED_S}; touch {mark}"],
                                start_new_session=True)
        (OUT / f"detached-{proc.pid}").touch()
        proc.wait()
"""
DETACHED_S = 20  # past the 15 s after which xdist's controller has ended its workers


@pytest.mark.slow
def test_under_xdist_a_teardown_in_a_session_of_its_own_outlives_the_workers(tmp_path: Path,
                                                                            sessions: list) -> None:
    """SIGTERM to the whole group (as `timeout` or a cancelled CI job sends it): each worker
    starts its teardown; the controller ends the workers about 15 s later, and what their
    teardowns started in sessions of their own goes on to its end."""
    pytest.importorskip("xdist")
    proc, out = session(tmp_path, "-n", "2", tests=2,
                        teardown=DETACHED.replace("{DETACHED_S}", str(DETACHED_S)))
    sessions.append(proc)
    try:
        wait_for(out, "started", 2, proc)
        os.killpg(proc.pid, signal.SIGTERM)
        ended(proc)
        deadline = time.monotonic() + WAIT_S
        while len(list(out.glob("torn-down-*"))) < 2:
            assert time.monotonic() < deadline, f"the teardowns did not end within {WAIT_S} s"
            time.sleep(0.2)
    finally:  # the teardowns' own sessions, should they still run
        for mark in out.glob("detached-*"):
            try:
                os.killpg(int(mark.name.split("-")[1]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_make_target_the_session_waited_for_is_told_then_killed(tmp_path: Path) -> None:
    told = tmp_path / "told"
    polite = subprocess.Popen(["sh", "-c", f"trap 'echo yes > {told}; exit 0' TERM; "
                               f"touch {tmp_path}/ready-polite; sleep 30 & wait"],
                              start_new_session=True, text=True)
    stubborn = subprocess.Popen(["sh", "-c", f"trap '' TERM; touch {tmp_path}/ready-stubborn; "
                                 "sleep 30 & wait"], start_new_session=True, text=True)
    try:
        wait_for(tmp_path, "ready", 2, polite)  # both shells have set their traps
        stop_make(polite, grace_s=WAIT_S)
        assert polite.returncode == 0 and told.read_text() == "yes\n"
        started = time.monotonic()
        stop_make(stubborn, grace_s=1)
        assert stubborn.returncode == -signal.SIGKILL
        assert time.monotonic() - started < WAIT_S
    finally:
        for proc in (polite, stubborn):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
