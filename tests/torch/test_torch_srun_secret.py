"""Under srun, the torch backend proves itself with MUNGE, as rxelab.init does, and puts no
secret in torch's store (issue 56, item 8): before, without RXELAB_JOB_TOKEN, rank 0 drew a
secret and put it in the store, which anyone who reaches the store reads, in place of MUNGE.
Without munged the drawn secret stays in the store, and rank 0 says so. munged is not on this
host: tests/unit/fakemunge.py stands in for munge and unmunge."""

from __future__ import annotations

import logging

import pytest
from rxelab.control import munge_credential
from rxelab.errors import ConfigError
from rxelab.torch import rendezvous as rdv

from tests.torch.test_torch_rendezvous import Store
from tests.unit.fakemunge import run_munged

SRUN = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
        "MASTER_ADDR": "127.0.0.1"}


@pytest.fixture
def fake_munged(tmp_path, monkeypatch):
    run_munged(tmp_path, monkeypatch)


def warned(caplog: pytest.LogCaptureFixture) -> str:
    """What the library warned of (a program without logging sees it on stderr)."""
    return " ".join(r.getMessage() for r in caplog.records
                    if r.name.startswith("rxelab") and r.levelno == logging.WARNING)


def test_under_srun_with_munge_nothing_secret_goes_into_the_store(fake_munged, caplog):
    store = Store()
    job0, listener = rdv.meet(store, 0, 2, 5.0, env=SRUN)
    try:
        job1, _ = rdv.meet(store, 1, 2, 5.0, env={**SRUN, "SLURM_PROCID": "1"})
        for job in (job0, job1):
            assert isinstance(job.credential, munge_credential.MungeCredential) and job.secured
        assert rdv.SECRET_KEY not in store.data, "a secret in the store"
        assert "MUNGE" in store.data[rdv.WHERE_KEY].decode()
        hs0, hs1 = job0.credential.handshake(), job1.credential.handshake()
        t = b"transcript"
        proof = hs0.prove(munge_credential.LISTENER, t)
        assert hs1.check(munge_credential.LISTENER, t, proof), "they prove to each other"
        assert "store" not in warned(caplog)
    finally:
        listener.close()


def test_a_rank_without_munge_where_rank_0_uses_it_is_refused(fake_munged, monkeypatch):
    store = Store()
    _, listener = rdv.meet(store, 0, 2, 5.0, env=SRUN)
    listener.close()
    monkeypatch.setattr(munge_credential, "SOCKETS", ("/nonexistent/munge.socket.2",))
    with pytest.raises(ConfigError, match="MUNGE"):
        rdv.meet(store, 1, 2, 5.0, env={**SRUN, "SLURM_PROCID": "1"})


def test_under_srun_without_munge_the_secret_in_the_store_is_said(monkeypatch, caplog):
    monkeypatch.setattr(munge_credential, "SOCKETS", ("/nonexistent/munge.socket.2",))
    store = Store()
    job0, listener = rdv.meet(store, 0, 2, 5.0, env=SRUN)
    listener.close()
    assert rdv.SECRET_KEY in store.data and job0.secured
    err = warned(caplog)
    assert "torch's store" in err and "MUNGE" in err and "RXELAB_JOB_TOKEN" in err, err
    job1, _ = rdv.meet(store, 1, 2, 5.0, env={**SRUN, "SLURM_PROCID": "1"})
    assert job1.credential.key == job0.credential.key
