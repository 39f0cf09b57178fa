"""The one place that starts processes: argv lists only, a deadline on every call, and
errors that name the command, its exit status and the tail of what it printed.

A missing program becomes a LabError that says which Debian package provides it, because
"FileNotFoundError: 'mmdebstrap'" is not something a newcomer can act on.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.errors import LabError
from infra.owned_paths import open_private

log = logging.getLogger("rxelab")
# A process (a build, a VM, a node) using more than this share of one core is working: an idle
# TCG guest takes ~1 %; a busy one all it is given, still ~15 % at a load of 13 on 2 cores.
BUSY_SHARE = 0.05
CPU_WINDOW_S = 10.0  # CPU use is judged over windows this long

# program -> where it comes from; used only to phrase the error when it is missing.
PROVIDERS: dict[str, str] = {
    "qemu-system-x86_64": "apt-get install qemu-system-x86",
    "qemu-img": "apt-get install qemu-utils",
    "mmdebstrap": "apt-get install mmdebstrap",
    "mkfs.ext4": "apt-get install e2fsprogs",
    "ssh": "apt-get install openssh-client",
    "ssh-keygen": "apt-get install openssh-client",
    "ip": "apt-get install iproute2",
    "vde_switch": "apt-get install vde2",
    "fakeroot": "apt-get install fakeroot",
}


@dataclass
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


class CommandError(LabError):
    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        if returncode < 0:
            how = f"was killed by {signal.Signals(-returncode).name}"
        else:
            how = f"exited with status {returncode}"
        tail = "\n".join((stderr or stdout).strip().splitlines()[-12:])
        super().__init__(f"`{shlex.join(argv)}` {how}" + (f":\n{tail}" if tail else ""))
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def missing_program(program: str) -> LabError:
    return LabError(f"{program} is not installed", hint=PROVIDERS.get(program, f"install {program}"))


def require(*programs: str) -> None:
    """Fail early, naming every missing program at once."""
    from shutil import which

    missing = [p for p in programs if which(p) is None]
    if missing:
        hints = sorted({PROVIDERS.get(p, f"install {p}") for p in missing})
        raise LabError(f"missing programs: {', '.join(missing)}", hint="; ".join(hints))


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    check: bool = True,
    capture: bool = True,
    timeout: float | None = 600,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    cwd: Path | None = None,
) -> Result:
    """Run argv to completion. On timeout the whole process group is killed, never left behind."""
    args = [os.fspath(a) for a in argv]
    log.debug("+ %s", shlex.join(args))
    full_env = {**os.environ, "LANG": "C.UTF-8", **(env or {})}
    proc, held = _started(
        args,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        env=full_env,
        cwd=cwd,
    )
    try:
        held.release()  # a signal held while the program started takes effect here
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise LabError(
            f"`{shlex.join(args)}` did not finish within {timeout:.0f} s and was stopped",
        ) from None
    except BaseException:  # KeyboardInterrupt included: the child must not outlive us
        _kill_group(proc)
        proc.wait()
        raise
    result = Result(args, proc.returncode, out or "", err or "")
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, result.stdout, result.stderr)
    return result


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (state first), or None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def session_cpu_seconds(sid: int) -> float:
    """The CPU time of a session's processes, with what their reaped children used: how a
    silent build shows it is working."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (f := stat_fields(int(entry.name))) and f[3] == str(sid):
            ticks += sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def run_streaming(
    argv: Sequence[str | os.PathLike[str]],
    *,
    prefix: str,
    timeout: float,
    log_file: Path,
    env: Mapping[str, str] | None = None,
    transform: Callable[[str], str | None] = lambda line: line,
    interrupt_grace: float = 0,
    stall: float | None = None,
    stall_setting: str = "RXELAB_STALL",
) -> None:
    """Run a long command whose own output is the best progress report: its lines are shown
    as they come (prefixed), all of them go to log_file, and a failure quotes the tail. With
    `stall`, it is stopped when it stands still that long (no output, its session's CPU idle),
    and `timeout` is only the cap of a run that keeps moving."""
    from collections import deque

    args = [os.fspath(a) for a in argv]
    log.debug("+ %s", shlex.join(args))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    # opened before the program starts, never through a link planted at its path
    written = open_private(log_file)
    tail: deque[str] = deque(maxlen=15)
    last_output = [time.monotonic()]

    def pump() -> None:
        assert proc.stdout is not None
        with written as f:
            for line in proc.stdout:
                last_output[0] = time.monotonic()
                f.write(line)
                tail.append(line.rstrip())
                shown = transform(line.rstrip())
                if shown is not None:
                    print(f"{prefix}{shown}", flush=True)

    try:
        proc, held = _started(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LANG": "C.UTF-8", **(env or {})},
            # it is interrupted with SIGINT below, which it cannot catch if it inherited the
            # signal ignored (a background job of a non-interactive shell, many CI runners)
            preexec_fn=_default_sigint if interrupt_grace > 0 else None,
        )
    except BaseException:
        written.close()
        raise

    reader: threading.Thread | None = None
    # from here on a signal (Ctrl-C, a closed terminal) is passed on to the program: nothing
    # stands between the program's start and this try (a signal in that gap, under CI's
    # load, once left a Terraform apply running, never told)
    try:
        held.release()  # a signal held while the program started takes effect here
        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        if stall is None:
            proc.wait(timeout=timeout)
        else:
            _wait_while_moving(proc, timeout, stall, last_output)
    except _Stalled as why:
        _kill_group(proc)
        proc.wait()
        raise LabError(f"`{args[0]}` {why} and was stopped",
                       hint=f"its full output is in {log_file}; a slow run that keeps moving is "
                            f"waited for: if it needs longer, set {stall_setting}=<seconds>") from None
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
        raise LabError(
            f"`{args[0]}` did not finish within {timeout:.0f} s and was stopped",
            hint=f"its full output is in {log_file}",
        ) from None
    except BaseException:
        if interrupt_grace > 0:
            try:
                os.killpg(proc.pid, signal.SIGINT)
                proc.wait(timeout=interrupt_grace)
            except (ProcessLookupError, subprocess.TimeoutExpired, KeyboardInterrupt):
                pass
        _kill_group(proc)
        proc.wait()
        raise
    finally:
        if reader is not None and reader.ident is not None:
            reader.join(timeout=5)
        else:
            written.close()  # the reader that closes it never started
    if proc.returncode != 0:
        raise CommandError(args, proc.returncode, "\n".join(tail), "")


class _Stalled(Exception):
    pass


def _wait_while_moving(proc: subprocess.Popen[str], cap: float, stall: float,
                       last_output: list[float]) -> None:
    """Wait for proc while it prints or uses CPU (its session's); _Stalled when it stands
    still for `stall` seconds or runs past `cap`."""
    began = moved = time.monotonic()
    cpu = (began, session_cpu_seconds(proc.pid))
    while True:
        try:
            proc.wait(timeout=1.0)
            return
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now - cpu[0] >= CPU_WINDOW_S:
            used = session_cpu_seconds(proc.pid)
            if used - cpu[1] >= BUSY_SHARE * (now - cpu[0]):
                moved = now
            cpu = (now, used)
        moved = max(moved, last_output[0])
        if now - moved > stall:
            raise _Stalled(f"made no progress for {stall:.0f} s (no output, no CPU used)")
        if now - began > cap:
            raise _Stalled(f"was still running after {cap:.0f} s")


class _HeldSignals:
    """Signals that stop a run, held while a program starts and delivered once it has: one
    that came inside `subprocess.Popen` after the fork (while it waits to hear that the exec
    worked) would raise there, before `Popen` returned the pid, and leave the program
    running in its own session, never told. Blocking the signals (`pthread_sigmask`) would
    not do: the kernel hands a process's signal to any thread not blocking it, the reader's
    among them, and Python then runs the handler in the main thread all the same. So the
    handlers are swapped for one that only notes the signal. Only Python handlers are held
    (KeyboardInterrupt, cli's SIGTERM and SIGHUP during a provision): an ignored signal stays
    ignored, and one left to its default ends the process at once, held or not. Handlers are
    the main thread's to set; elsewhere nothing is held."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.noted: list[int] = []
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            for sig in self.SIGNALS:
                handler = signal.getsignal(sig)
                if callable(handler):  # not SIG_IGN, SIG_DFL or None (set outside Python)
                    self.previous[sig] = handler
                    signal.signal(sig, self._note)
        except BaseException:  # a signal whose handler is not swapped yet: none stays held
            self._restore()
            raise

    def _note(self, signum: int, frame: object) -> None:
        self.noted.append(signum)

    def _restore(self) -> None:
        pending, self.previous = self.previous, {}
        try:
            for sig in list(pending):
                signal.signal(sig, pending.pop(sig))
        finally:  # a signal restored first raised before the others were: they are, still
            for sig, handler in pending.items():
                signal.signal(sig, handler)

    def release(self) -> None:
        """Put the handlers back, then raise each noted signal again (at most once each), so
        that what the handler does (KeyboardInterrupt, a LabError) happens here."""
        self._restore()
        for sig in dict.fromkeys(self.noted):
            signal.raise_signal(sig)


def _started(args: list[str], **popen: Any) -> tuple[subprocess.Popen[str], _HeldSignals]:
    """The program started in a session of its own, and the signals held meanwhile: the
    caller releases them first thing inside the try that stops the program."""
    held = _HeldSignals()
    try:
        return subprocess.Popen(args, text=True, start_new_session=True, **popen), held
    except FileNotFoundError:
        held.release()
        raise missing_program(args[0]) from None
    except BaseException:
        held.release()
        raise


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def detach_from_terminal(log: Path | None = None) -> None:
    """After SIGHUP the terminal is gone, and a write to it fails (EIO): what is still said
    during the clean-up goes to `log` (private, appended to) or nowhere."""
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:  # never through a link planted at its path: then nowhere
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        except OSError:
            fd = os.open(os.devnull, os.O_WRONLY)
    else:
        fd = os.open(os.devnull, os.O_WRONLY)
    for std in (1, 2):
        os.dup2(fd, std)
    os.close(fd)


def stop_pidfile(pidfile: Path, expected: str, grace_s: float = 5.0) -> bool:
    """Stop the process a pidfile names, but only if it still is the program we started: the
    program's name and, in its command line, the pidfile's own path (qemu and vde_switch were
    told to write it), so a recycled pid or another lab's process is never signalled."""
    try:
        pid = int(pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        pidfile.unlink(missing_ok=True)
        return False
    ours = str(pidfile)
    stopped = False
    if process_is(pid, expected, ours):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while process_is(pid, expected, ours) and time.monotonic() < deadline:
            time.sleep(0.1)
        if process_is(pid, expected, ours):
            os.kill(pid, signal.SIGKILL)
        stopped = True
    pidfile.unlink(missing_ok=True)
    return stopped


def cmdline(pid: int) -> list[str] | None:
    """A live (not zombie) process's arguments, or None."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if "State:\tZ" in status or not raw or not raw[0]:
        return None
    return [a.decode(errors="replace") for a in raw if a]


def process_is(pid: int, expected: str, argument: str | None = None) -> bool:
    """pid runs `expected` (and, if given, has `argument` among its arguments)."""
    args = cmdline(pid)
    if not args:
        return False
    return Path(args[0]).name == expected and (argument is None or argument in args)
