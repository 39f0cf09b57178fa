"""MUNGE as the job's credential under Slurm (issue 28): with no secret exported, the ranks of
an srun job prove to each other that they are the same user's processes of the same job, by
MUNGE credentials over the handshake's transcript; another user, a replayed credential, or a
proof over another transcript is refused. munged is not on this host: tests/unit/fakemunge.py
stands in for munge and unmunge, with their promises."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from rxelab.bootstrap import discover
from rxelab.control import handshake, munge_credential
from rxelab.control.handshake import CONNECTOR, LISTENER

from tests.unit.fakejob import run_ranks
from tests.unit.fakemunge import install, run_munged

T = handshake.transcript({"kind": "hello", "rank": 1, "to": 0, "generation": 0,
                     "scope": "rendezvous 12345 3 slurm-7.0", "nonce": "ab" * 32}, "cd" * 32)


@pytest.fixture
def ours(tmp_path):
    where = install(tmp_path / "ours", os.geteuid())
    return munge_credential.MungeCredential(str(where / "munge"), str(where / "unmunge"))


@pytest.fixture
def someone_else(tmp_path):
    where = install(tmp_path / "theirs", 4242)
    cred = munge_credential.MungeCredential(str(where / "munge"), str(where / "unmunge"))
    cred.uid = 4242
    return cred


def test_both_ends_prove_themselves_and_agree_on_the_seal(ours):
    connector, listener = ours.handshake(), ours.handshake()
    assert connector.check(LISTENER, T, listener.prove(LISTENER, T))
    assert listener.check(CONNECTOR, T, connector.prove(CONNECTOR, T))
    assert connector.seal_key(T) == listener.seal_key(T)
    other = ours.handshake()
    assert other.check(LISTENER, T, ours.handshake().prove(LISTENER, T))
    other.prove(CONNECTOR, T)
    assert other.seal_key(T) != connector.seal_key(T), "every connection's keys are its own"


@pytest.mark.slow
def test_a_proof_of_another_role_transcript_or_user_or_a_replay_is_refused(ours, someone_else):
    assert not ours.handshake().check(CONNECTOR, T, ours.handshake().prove(LISTENER, T)), \
        "a listener's proof as a connector's"
    other_t = T.replace(b"slurm-7.0", b"slurm-8.0")
    assert not ours.handshake().check(LISTENER, other_t, ours.handshake().prove(LISTENER, T)), \
        "a proof over another job's transcript"
    proof = ours.handshake().prove(LISTENER, T)
    assert ours.handshake().check(LISTENER, T, proof)
    assert not ours.handshake().check(LISTENER, T, proof), "munged refuses a replay"
    theirs = someone_else.handshake().prove(LISTENER, T)
    assert not ours.handshake().check(LISTENER, T, theirs), "another user's credential"
    assert not someone_else.handshake().check(LISTENER, T, ours.handshake().prove(LISTENER, T)), \
        "another user decoded ours"
    assert not ours.handshake().check(LISTENER, T, "MUNGE:garbage:"), "garbage"


def test_an_srun_job_without_a_secret_forms_over_munge(tmp_path, monkeypatch):
    run_munged(tmp_path, monkeypatch)
    monkeypatch.delenv("RXELAB_JOB_TOKEN", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    job = discover(0, 3, "127.0.0.1", 1)
    assert isinstance(job.credential, munge_credential.MungeCredential) and job.secured
    assert "slurm-77.0" in job.scope()

    def work(comm):
        y = np.empty(8)
        comm.allreduce(np.full(8, comm.rank + 1.0), y)
        return float(y[0]), comm.job.credential.source

    started = time.monotonic()
    out = run_ranks(3, work, timeout=20)
    assert [x[0] for x in out] == [6.0] * 3 and "MUNGE" in out[0][1]
    assert time.monotonic() - started < 30


def test_without_munged_a_job_without_a_secret_stays_open(monkeypatch):
    monkeypatch.setattr(munge_credential, "SOCKETS", ("/nonexistent/munge.socket.2",))
    job = discover(0, 2, "127.0.0.1", 1, env={"SLURM_JOB_ID": "5"})
    assert not job.secured
