"""Our launcher on this machine (ranks on 'localhost' run without SSH, under the same guard
as remote ones): output and status, and no rank outliving the launcher however it ends."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rxelab import launch
from rxelab.control.handshake import weakness

from infra.config import REPO

RANK = "echo $$ > {dir}/$RANK.pid; exec sleep 300"


def launcher(tmp_path: Path, *args: str, command: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "lib")}
    # SIGINT as a terminal gives it, whatever this test runs under (a background job of a
    # script starts with SIGINT ignored, and a launcher would inherit that)
    return subprocess.Popen([sys.executable, "-m", "rxelab.launch", *args, "--", "sh", "-c",
                             command.format(dir=tmp_path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def rank_pids(tmp_path: Path, n: int, timeout: float = 20) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        files = sorted(tmp_path.glob("*.pid"))
        if len(files) == n and all(f.read_text().strip() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.1)
    raise AssertionError(f"{n} ranks did not start within {timeout} s")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is not running
            return f.read().split(") ")[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_gone(pids: list[int], timeout: float = 15) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.fixture
def cleanup():
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:  # whatever a failed test left: stop it by its own pid
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_output_is_prefixed_status_is_the_first_failure_and_ranks_share_a_token(tmp_path, cleanup):
    """...and the token is on no command line of this host while the ranks run (`ps` shows
    command lines to every user)."""
    p = launcher(tmp_path, "--hosts", "localhost,127.0.0.1",
                 command="echo rank=$RANK of $WORLD_SIZE token=$RXELAB_JOB_TOKEN; "
                         "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done "
                         "> {dir}/cmdlines.$RANK 2>/dev/null; exit $RANK")
    cleanup.append(p)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 1, out
    lines = sorted(x for x in out.splitlines() if "rank=" in x)
    assert lines[0].startswith("[0] rank=0 of 2") and lines[1].startswith("[1] rank=1 of 2")
    tokens = {x.split("token=")[1] for x in lines}
    assert len(tokens) == 1
    token = tokens.pop()
    assert weakness(token) is None and len(token) == 43, token  # 256 bits, base64url
    seen = (tmp_path / "cmdlines.0").read_text() + (tmp_path / "cmdlines.1").read_text()
    assert "rxelab.launch" in seen and "RANK=1" in seen, "the command lines were read"
    assert token not in seen


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL])
def test_no_rank_outlives_its_launcher(tmp_path, cleanup, sig):
    p = launcher(tmp_path, "--hosts", "localhost,127.0.0.1", "--per-host", "2", command=RANK)
    cleanup.append(p)
    pids = rank_pids(tmp_path, 4)
    os.kill(p.pid, sig)
    p.wait(timeout=30)
    assert wait_gone(pids) == [], f"ranks still running after {sig.name} to the launcher"
    if sig != signal.SIGKILL:
        assert p.returncode in (130, 143), p.returncode


@pytest.mark.slow
def test_the_timeout_ends_every_rank(tmp_path, cleanup):
    p = launcher(tmp_path, "--hosts", "localhost", "--per-host", "2", "--timeout", "3",
                 command=RANK)
    cleanup.append(p)
    pids = rank_pids(tmp_path, 2)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 124 and "stopping the job after 3 s" in out
    assert wait_gone(pids) == []


@pytest.mark.parametrize(("signals", "status"), [
    ((signal.SIGTERM, signal.SIGHUP, signal.SIGTERM), 143), ((signal.SIGINT, signal.SIGTERM), 130)])
def test_a_second_signal_during_the_stop_does_not_interrupt_the_clean_up(tmp_path, cleanup,
                                                                          signals, status):
    """`timeout`, a terminal and a user can all signal at once: the first signal stops the
    job, any others are ignored (before, the second one escaped as a traceback mid-clean-up)."""
    p = launcher(tmp_path, "--hosts", "localhost", "--per-host", "2", command=RANK)
    cleanup.append(p)
    pids = rank_pids(tmp_path, 2)
    for sig in signals:
        os.kill(p.pid, sig)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == status, out
    assert "Traceback" not in out and "stopping every rank" in out, out
    assert wait_gone(pids) == []


@pytest.mark.slow
def test_an_elastic_job_goes_on_past_a_failed_rank_and_ends_well_if_any_rank_did(tmp_path, cleanup):
    """Without --elastic the first failure ends the job (the rest within 90 s); with it, rank
    1's failure leaves rank 0 running to its own end, and the job's status is a success."""
    p = launcher(tmp_path, "--elastic", "--hosts", "localhost,127.0.0.1",
                 command="if [ $RANK = 1 ]; then exit 3; fi; sleep 2; echo survived; exit 0")
    cleanup.append(p)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and "[0] survived" in out, out
    p = launcher(tmp_path, "--elastic", "--hosts", "localhost,127.0.0.1", command="exit 3")
    cleanup.append(p)
    p.communicate(timeout=60)
    assert p.returncode == 3, "nobody finished: the failure is the job's"
    p = launcher(tmp_path, "--elastic", "--hosts", "localhost,127.0.0.1",
                 command="if [ $RANK = 1 ]; then exit 1; fi; exit 0")
    cleanup.append(p)
    p.communicate(timeout=60)
    assert p.returncode == 1, "a wrong result is not a loss the job may take"


@pytest.mark.slow
def test_newcomers_get_the_rendezvous_and_the_job_s_secret_from_a_private_file(tmp_path, cleanup):
    secret = tmp_path / "secret"
    secret.write_text("JPrm-WjSNOqrWZ8HLGJnVaT8PRpWOIiXYT9TxA0tIKI\n")
    secret.chmod(0o600)
    p = launcher(tmp_path, "--join", "--master", "node1", "--port", "29611", "--secret-file",
                 str(secret), "--hosts", "localhost",
                 command="echo master=$MASTER_ADDR:$MASTER_PORT rank=${{RANK-none}} "
                         "token=$RXELAB_JOB_TOKEN")
    cleanup.append(p)
    out, _ = p.communicate(timeout=60)
    want = "master=node1:29611 rank=none token=JPrm-WjSNOqrWZ8HLGJnVaT8PRpWOIiXYT9TxA0tIKI"
    assert p.returncode == 0 and want in out, out
    secret.chmod(0o644)
    p = launcher(tmp_path, "--secret-file", str(secret), "--hosts", "localhost", command="true")
    cleanup.append(p)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2 and "--secret-file" in out and "readable by others" in out, out
    p = launcher(tmp_path, "--join", "--hosts", "localhost", command="true")
    cleanup.append(p)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2 and "--master" in out, out
    p = launcher(tmp_path, "--master", "node1", "--hosts", "localhost", command="true")
    cleanup.append(p)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2 and "give it with --join" in out, out


def test_the_transport_and_congestion_reach_a_remote_rank_quoted():
    """Every rank must agree on the transport, so the launcher passes on what its caller set
    (a local rank would inherit it anyway; a remote one gets only what the command line
    carries), and a value a shell would read reaches the rank as it was."""
    env = launch.forwarded_env({"RXELAB_TRANSPORT": "tcp; touch x", "RXELAB_CONGESTION": "cubic",
                                "HOME": "/root", "RXELAB_RUN_ID": "", "RXELAB_LOG_LEVEL": "debug",
                                "RXELAB_DEBUG": "1"})
    assert env == {"RXELAB_TRANSPORT": "tcp; touch x", "RXELAB_CONGESTION": "cubic",
                   "RXELAB_LOG_LEVEL": "debug", "RXELAB_DEBUG": "1"}, "the log switch too"
    argv = launch.rank_argv("node9", env, ["rxelab-selftest"])
    assert argv[:2] == ["ssh", "-o"] and argv[-2] == "node9"
    remote = shlex.split(argv[-1])  # what the remote shell runs, word by word
    assert "RXELAB_TRANSPORT=tcp; touch x" in remote and "RXELAB_CONGESTION=cubic" in remote


def test_a_hostfile_s_slots_give_each_host_its_ranks(tmp_path, cleanup):
    """Issue 59: `localhost slots=2` runs ranks 0 and 1 there (local ranks 0, 1) and the next
    line's host the rest, --per-host for a line without slots=; comments and blank lines are
    skipped."""
    hosts = tmp_path / "hosts"
    hosts.write_text("# this machine, by two names\nlocalhost slots=2   # two here\n\n"
                     "127.0.0.1\n")
    p = launcher(tmp_path, "--hostfile", str(hosts), "--per-host", "3",
                 command="echo rank=$RANK local=$LOCAL_RANK of $WORLD_SIZE at $MASTER_ADDR")
    cleanup.append(p)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    ran = sorted(x for x in out.splitlines() if "rank=" in x)
    assert ran == ["[0] rank=0 local=0 of 5 at localhost", "[1] rank=1 local=1 of 5 at localhost",
                   "[2] rank=2 local=0 of 5 at localhost", "[3] rank=3 local=1 of 5 at localhost",
                   "[4] rank=4 local=2 of 5 at localhost"], out


@pytest.mark.parametrize(("args", "problem"), [
    (["--hosts", "a", "--hostfile", "HOSTS"], "give --hosts or --hostfile, not both"),
    (["--hostfile", "ABSENT"], "--hostfile ABSENT: No such file or directory"),
    (["--hostfile", "HOSTS"], "--hostfile HOSTS line 2: slots=0 is not a positive integer"),
    (["--hosts", "node[1-3"], "--hosts: hostlist 'node[1-3': a '[' without its ']'"),
    (["--hosts", "node1,-oProxyCommand=x"], "--hosts: hostlist '-oProxyCommand=x': "
                                            "'-oProxyCommand=x' is not a host name"),
    (["--hosts=-v"], "--hosts: '-v' is not a host name"),
    (["--hosts", "node[1-2]", "--per-host", "9000"], "--hosts: 2 hosts x 9000 ranks is more "
                                                     "than the 16384 ranks rxelab supports"),
    (["--join", "--master", "$(reboot)", "--secret-file", "SECRET", "--hosts", "localhost"],
     "--master: '$(reboot)' is not a host name"),
])
def test_bad_hosts_are_one_line_and_status_2(tmp_path, capsys, args, problem):
    """Each is said before anything starts, as argparse says a bad flag, never a traceback."""
    (tmp_path / "hosts").write_text("node1\nnode2 slots=0\n")
    (tmp_path / "secret").write_text("JPrm-WjSNOqrWZ8HLGJnVaT8PRpWOIiXYT9TxA0tIKI\n")
    (tmp_path / "secret").chmod(0o600)
    names = {"HOSTS": str(tmp_path / "hosts"), "ABSENT": str(tmp_path / "absent"),
             "SECRET": str(tmp_path / "secret")}
    args = [names.get(a, a) for a in args]
    problem = problem.replace("HOSTS", names["HOSTS"]).replace("ABSENT", names["ABSENT"])
    with pytest.raises(SystemExit) as stop:
        launch.main([*args, "--", "true"])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    said = [x for x in err.splitlines() if "error:" in x]
    assert len(said) == 1 and f"error: {problem}" in said[0], err
    assert err.splitlines()[-1] == said[0], "the reason is the last line"


def test_the_help_tells_of_hostlists_and_hostfiles(capsys):
    with pytest.raises(SystemExit):
        launch.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--hostfile FILE" in text and "slots=2" in text and "node[1-3,7]" in text, text
