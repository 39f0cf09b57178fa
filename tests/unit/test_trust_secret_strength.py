"""A job's secret is too strong to guess offline (issue 56, item 3). A listener proves itself
first, so one knock gives a stranger an HMAC to test guesses against: with a hand-exported
RXELAB_JOB_TOKEN=hunter2 another local user (a separate process of uid nobody) found it in a
small word list and could join. Now a secret of less than 128 bits, or of little variety, is
refused before any listener opens, and every secret the project makes or takes passes."""

from __future__ import annotations

import os
import threading
import time

import pytest
import rxelab
from pyverbs import _fabric
from rxelab.bootstrap import discover, job_secret, open_mpi_key_is_secret
from rxelab.control import handshake
from rxelab.errors import ConfigError
from rxelab.launch import main as launch_main

from tests.unit.fakejob import free_port
from tests.unit.strangers import stranger_process

GUESSER = r"""
import socket, sys, time
from rxelab.control import handshake
from rxelab.control import framing
port, scope = int(sys.argv[1]), sys.argv[2]
words = ["password", "letmein", "secret", "hunter2", "dragon"]
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=1)
    except OSError:
        time.sleep(0.02)
        continue
    knock = {"type": "knock", "kind": "hello", "rank": 1, "to": 0, "generation": 0,
             "scope": scope, "nonce": handshake.nonce()}
    framing.send(s, knock)
    challenge = framing.recv(s, deadline=time.monotonic() + 5, peer="rank 0", expect="challenge")
    t = handshake.transcript(knock, challenge["nonce"])
    for w in words:  # offline: nothing more is sent
        if handshake.SharedSecret.of(w, "guess").check(handshake.LISTENER, t, challenge["proof"]):
            print("found", w, flush=True)
            sys.exit(0)
    print("knocked, no guess fits", flush=True)
    sys.exit(0)
print("nothing listened", flush=True)
"""


@pytest.mark.slow
def test_a_weak_token_is_refused_before_a_stranger_can_knock(monkeypatch):
    """The stranger knocks at rank 0's rendezvous for the whole time rank 0 tries to start;
    rank 0 refuses the weak token at once, naming it, and nothing ever listens."""
    monkeypatch.setenv("RXELAB_JOB_TOKEN", "hunter2")
    port = free_port()
    _fabric.FABRIC.reset(seed=0, max_delay=0.0002)
    import rxelab.comm  # init imports it: not part of what is timed
    with stranger_process(GUESSER, str(port), f"rendezvous {port} 2", "4") as guesser:
        started = time.monotonic()
        with pytest.raises(ConfigError, match="RXELAB_JOB_TOKEN.*bits.*--new-token") as err:
            rxelab.init(0, 2, "127.0.0.1", port, device="fake0", timeout=4)
        took = time.monotonic() - started
        out, _ = guesser.communicate(timeout=30)
    assert "\n" not in str(err.value), "one line"
    assert took < 2, f"refused only after {took:.1f} s"
    assert "found" not in out and "nothing listened" in out, out


def test_a_strong_token_still_forms_a_job(monkeypatch):
    monkeypatch.setenv("RXELAB_JOB_TOKEN", handshake.new_token())
    _fabric.FABRIC.reset(seed=0, max_delay=0.0002)
    port, sizes = free_port(), {}

    def rank(r: int) -> None:
        with rxelab.init(r, 2, "127.0.0.1", port, device="fake0", timeout=20) as comm:
            sizes[r] = comm.size
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sizes == {0: 2, 1: 2}


@pytest.mark.parametrize("weak", ["hunter2", "x", "a" * 200, "ab" * 100, "0123456789abcde" * 2,
                                  "correct horse battery"])
def test_weak_tokens_in_the_environment_or_a_file_are_refused(weak, tmp_path):
    with pytest.raises(ConfigError, match="RXELAB_JOB_TOKEN"):
        job_secret({"RXELAB_JOB_TOKEN": weak})
    path = tmp_path / "secret"
    path.write_text(weak + "\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="RXELAB_JOB_TOKEN_FILE.*bits|distinct"):
        discover(env={"RANK": "0", "WORLD_SIZE": "1", "RXELAB_JOB_TOKEN_FILE": str(path)})


def test_the_generator_and_every_secret_the_project_makes_pass(capsys, tmp_path):
    assert launch_main(["--new-token"]) == 0
    token = capsys.readouterr().out.strip()
    assert handshake.strength(token) >= 128 and handshake.weakness(token) is None
    assert len({handshake.new_token() for _ in range(100)}) == 100
    for _ in range(200):  # the launcher's, the torch rendezvous's (token_hex(32)), Open MPI's
        assert handshake.weakness(handshake.new_token()) is None
        assert handshake.weakness(os.urandom(32).hex()) is None
        assert open_mpi_key_is_secret(f"{os.urandom(8).hex()}-{os.urandom(8).hex()}")
    assert handshake.weakness("3c7ba4114e40cf4f3dfe2b82d46d028b") is None  # 32 hex digits: 128 bits
    path = tmp_path / "secret"
    path.write_text(token + "\n")
    path.chmod(0o600)
    assert job_secret({"RXELAB_JOB_TOKEN_FILE": str(path)}) == (token, "RXELAB_JOB_TOKEN_FILE")


def test_an_open_mpi_key_made_from_the_job_ids_is_no_secret():
    """Open MPI's direct launch (ess/pmi) makes its key from the job's ids: not taken."""
    env = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0",
           "OMPI_MCA_orte_precondition_transports": "012cc14200000000-012cc14200000000"}
    assert job_secret(env) == ("", "")
    env["OMPI_MCA_orte_precondition_transports"] = "3c7ba4114e40cf4f-3dfe2b82d46d028b"
    assert job_secret(env)[1] == "Open MPI's job key"
