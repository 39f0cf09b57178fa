"""The library's log switch (issue 59), as NCCL_DEBUG is NCCL's: RXELAB_LOG_LEVEL or
RXELAB_DEBUG=1 adds a handler that names host, process and rank; unset, the library adds none
(its warnings still reach a program without logging, through Python's last resort); a wrong
value is refused in one line naming the right ones."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rxelab import logs, settings
from rxelab.errors import ConfigError

from tests.unit.fakejob import run_ranks

LIB = Path(__file__).resolve().parents[2] / "lib"

# two ranks over tcp in one process, then what the library did to logging
JOB = """
import logging, socket, sys, threading, rxelab
listener = socket.create_server(("127.0.0.1", 0))
port = listener.getsockname()[1]
failed = []
def rank(r):
    try:
        with rxelab.init(r, 2, "127.0.0.1", port, transport="tcp", timeout=5,
                         **({"_listener": listener} if r == 0 else {})):
            pass
    except rxelab.RdmaError as err:
        failed.append(f"rank {r}: {type(err).__name__}: {err}")
ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
[t.start() for t in ts]; [t.join(60) for t in ts]
if failed:
    sys.exit("; ".join(sorted(failed)))
from rxelab.control import addresses
from rxelab.bootstrap import JobInfo
addresses.listen(JobInfo(0, 2, "127.0.0.1", 0, "arguments")).close()  # warns: no secret
lib = logging.getLogger("rxelab")
print(len(lib.handlers), lib.level, lib.propagate, len(logging.root.handlers))
"""


def job(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("RXELAB_", "PYTEST")) and k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True,
                          timeout=120, cwd="/", env={**clean, "PYTHONPATH": str(LIB), **env})


@pytest.fixture
def untouched() -> Iterator[None]:
    """The rxelab logger as it was, whatever a test's configure() did."""
    yield
    logs.configure({})
    assert logging.getLogger("rxelab").handlers == []


@pytest.mark.parametrize("env, level", [
    ({}, None), ({"RXELAB_LOG_LEVEL": ""}, None), ({"RXELAB_DEBUG": "0"}, None),
    ({"RXELAB_LOG_LEVEL": "debug"}, logging.DEBUG), ({"RXELAB_LOG_LEVEL": "INFO"}, logging.INFO),
    ({"RXELAB_LOG_LEVEL": " Warning "}, logging.WARNING),
    ({"RXELAB_LOG_LEVEL": "error"}, logging.ERROR), ({"RXELAB_DEBUG": "1"}, logging.DEBUG),
    ({"RXELAB_DEBUG": "1", "RXELAB_LOG_LEVEL": "error"}, logging.DEBUG),  # the more verbose
    ({"RXELAB_DEBUG": "0", "RXELAB_LOG_LEVEL": "info"}, logging.INFO),
])
def test_the_level_each_setting_asks_for(env, level):
    assert logs.level_from(env) == level


@pytest.mark.parametrize("env, said", [
    ({"RXELAB_LOG_LEVEL": "verbose"}, "RXELAB_LOG_LEVEL='verbose': no such log level "
                                      "(hint: one of debug, info, warning, error (in any case))"),
    ({"RXELAB_LOG_LEVEL": "critical"}, "RXELAB_LOG_LEVEL='critical': no such log level"),
    ({"RXELAB_LOG_LEVEL": "10"}, "RXELAB_LOG_LEVEL='10': no such log level"),
    ({"RXELAB_DEBUG": "yes"}, "RXELAB_DEBUG='yes': 1 turns the library's debug log on"),
])
def test_a_wrong_value_is_refused_in_one_line_naming_the_right_ones(env, said):
    with pytest.raises(ConfigError) as caught:
        logs.level_from(env)
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


def test_the_names_are_the_settings_own():
    assert (settings.LOG_LEVEL_ENV, settings.DEBUG_ENV) == ("RXELAB_LOG_LEVEL", "RXELAB_DEBUG")
    assert all(hasattr(logging, name.upper()) for name in settings.LOG_LEVELS)


def test_switched_on_one_handler_in_the_switch_s_format_then_off_again(untouched):
    lib = logging.getLogger("rxelab")
    logs.configure({"RXELAB_LOG_LEVEL": "info", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"})
    logs.configure({"RXELAB_LOG_LEVEL": "debug"})  # again: the same handler, a new level
    (handler,) = lib.handlers
    assert lib.level == logging.DEBUG and not lib.propagate
    record = logging.LogRecord("rxelab.x", logging.DEBUG, __file__, 1, "hello %s", ("you",), None)
    assert handler.filter(record)
    assert handler.format(record).endswith(f":{os.getpid()} [3] DEBUG rxelab.x: hello you")
    logs.at_rank(1)
    assert handler.filter(record) and "[1] DEBUG" in handler.format(record)
    logs.configure({})
    assert lib.handlers == [] and lib.level == logging.NOTSET and lib.propagate


def test_unset_the_library_adds_no_handler(untouched):
    logs.configure({"RXELAB_DEBUG": "0"})
    assert logging.getLogger("rxelab").handlers == []
    assert logging.getLogger("rxelab").level == logging.NOTSET


def test_a_job_forming_logs_each_step_at_debug_level(caplog):
    caplog.set_level(logging.DEBUG, logger="rxelab")
    run_ranks(2, lambda comm: None, transport="tcp")
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    for step in ("rank 1 of 2 opens transport tcp", "transport tcp listens on",
                 "rank 0 gathers 2 ranks", "rank 1 (host ", "rank 1 reached rank 0",
                 "transport tcp: connected to rank 0", "rank 0 of 2 formed job",
                 "rank 1 of 2 closed its communicator"):
        assert any(step in s for s in said), (step, said)


def test_verbs_logs_its_device_port_gid_and_each_qp(caplog):
    caplog.set_level(logging.DEBUG, logger="rxelab.verbs")
    run_ranks(2, lambda comm: None)
    said = [r.getMessage() for r in caplog.records]
    assert any(s.startswith("device fake0 port 1: GID index 1 (0000:") for s in said), said
    assert any(s.startswith("QP ") and "connected to rank 1's QP" in s for s in said), said


@pytest.mark.slow
def test_debug_lines_appear_with_the_switch_on_and_not_without():
    quiet = job()
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.split() == ["0", "0", "True", "0"], "unset: logging left as it was"
    assert "DEBUG" not in quiet.stderr, quiet.stderr
    # a warning still reaches a program that set up no logging, as the print it was did
    assert quiet.stderr.startswith("rxelab: this job has no secret"), quiet.stderr
    for env in ({"RXELAB_LOG_LEVEL": "DEBUG"}, {"RXELAB_DEBUG": "1"}):
        loud = job(**env)
        assert loud.returncode == 0, loud.stderr
        assert loud.stdout.split() == ["1", "10", "False", "0"]
        lines = loud.stderr.splitlines()
        formed = [x for x in lines if "DEBUG rxelab.comm.communicator: rank 1 of 2 formed" in x]
        assert len(formed) == 1 and " [1] DEBUG" in formed[0], loud.stderr
        assert any(" WARNING rxelab.control.addresses: rxelab: this job has no secret" in x
                   for x in lines), loud.stderr


@pytest.mark.slow
def test_a_higher_level_hides_what_is_below_it_and_a_wrong_one_stops_init():
    errors_only = job(RXELAB_LOG_LEVEL="error")
    assert errors_only.returncode == 0 and errors_only.stderr == "", errors_only.stderr
    wrong = job(RXELAB_LOG_LEVEL="chatty")
    assert wrong.returncode != 0
    assert wrong.stderr.startswith("rank 0: ConfigError: RXELAB_LOG_LEVEL='chatty': no such "
                                   "log level (hint: one of debug, info, warning, error"), \
        wrong.stderr
