"""Another local user for the trust tests: a Python program run as `nobody`, a process of its
own under another uid, as an attacker on a shared node would be. It runs the system's Python
with the repository's `lib/` on its path (the library is readable by everyone; the venv may
not be), so it uses only the standard library and rxelab. A test without root to switch users
is skipped, saying so; every process started here is stopped by its pid, also on failure."""

from __future__ import annotations

import os
import pwd
import select
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[2] / "lib"
USER = "nobody"


def stranger() -> pwd.struct_passwd:
    """The other user, or a skip naming why there is none."""
    if os.geteuid() != 0:
        pytest.skip("running a process as another user needs root")
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"this host has no user {USER!r}")


def python() -> str:
    """A Python the other user can run: ours if it can, else the system's."""
    for candidate in (sys.executable, shutil.which("python3") or "", "/usr/bin/python3"):
        if candidate and _runs_as_stranger(candidate):
            return candidate
    pytest.skip(f"no Python that {USER} may run")


def _runs_as_stranger(exe: str) -> bool:
    user = stranger()
    try:
        r = subprocess.run([exe, "-c", "import socket, hmac"], user=user.pw_uid,
                           group=user.pw_gid, extra_groups=[], capture_output=True, timeout=60,
                           cwd="/")
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def _command(code: str) -> tuple[list[str], dict[str, str]]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(LIB), "HOME": "/nonexistent",
           "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
    return [python(), "-c", textwrap.dedent(code)], env


def run_as_stranger(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `code` (with `args` as sys.argv[1:]) as the other user to its end."""
    user = stranger()
    argv, env = _command(code)
    return subprocess.run([*argv, *args], user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                          env=env, cwd="/", capture_output=True, text=True, timeout=timeout)


@contextmanager
def stranger_process(code: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`code` running as the other user for the block's life; stopped by its pid at the end
    (TERM, then KILL), its output readable after the block."""
    user = stranger()
    argv, env = _command(code)
    proc = subprocess.Popen([*argv, *args], user=user.pw_uid, group=user.pw_gid,
                            extra_groups=[], env=env, cwd="/", stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for_word(proc: subprocess.Popen[str], word: str, seconds: float, what: str,
                  said: bytearray | None = None) -> str:
    """Until `proc` prints `word` (a stranger saying it is ready: "bound", "flooding"), at most
    `seconds`: all it printed so far. `what` names what the test waits for, in the failure;
    `said` keeps what it printed for a later call that waits for a later word. Reads the pipe
    itself (not proc.stdout's buffer): proc.communicate() takes the rest afterwards."""
    said = bytearray() if said is None else said
    assert proc.stdout is not None, "the process's output is not piped"
    fd = proc.stdout.fileno()
    end = time.monotonic() + seconds
    while word.encode() not in said:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"waited {seconds:g} s for {what}: it never said {word!r} "
                                 f"(it said {bytes(said)!r})")
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError(f"waited for {what}: the process ended before it said "
                                     f"{word!r} (it said {bytes(said)!r}; {_errors(proc)})")
            said += chunk
    return said.decode(errors="replace")


def _errors(proc: subprocess.Popen[str]) -> str:
    """What it wrote to its error output, as far as is there within a second."""
    if proc.stderr is None:
        return "its error output is not piped"
    fd, out, end = proc.stderr.fileno(), b"", time.monotonic() + 1
    while (left := end - time.monotonic()) > 0 and select.select([fd], [], [], left)[0]:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        out += chunk
    return f"exit status {proc.poll()}, error output {out[-2000:]!r}"
