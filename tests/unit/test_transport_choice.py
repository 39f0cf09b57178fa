"""A communicator's transport is chosen once (init's transport=, else RXELAB_TRANSPORT, else
verbs), refused in words when it is unknown or cannot be opened, agreed by every rank and
every newcomer, and carried to the next communicator of an elastic job."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import rxelab
from rxelab import settings, transports
from rxelab.errors import ConfigError, PeerError

from tests.unit.fakejob import run_ranks

SECRET = "o7MjB-iDsO6_bnLEIFBkYMa20z0jsE4Ee0KvJk83iU4"


def test_init_argument_then_environment_then_verbs(monkeypatch):
    monkeypatch.delenv(settings.TRANSPORT_ENV, raising=False)
    assert transports.choose(None) == "verbs"
    monkeypatch.setenv(settings.TRANSPORT_ENV, "tcp")
    assert transports.choose(None) == "tcp"
    assert transports.choose("verbs") == "verbs"
    assert transports.choose("verbs") == "verbs"
    monkeypatch.setenv(settings.TRANSPORT_ENV, "")
    assert transports.choose(None) == "verbs"
    monkeypatch.setenv(settings.TRANSPORT_ENV, "quic")
    assert transports.choose(None) == "quic"


@pytest.mark.parametrize("given,env,said", [
    ("rdma", None, "transport='rdma': no such transport"),
    (None, "TCP", "RXELAB_TRANSPORT='TCP': no such transport"),
    ("QUIC", "verbs", "transport='QUIC': no such transport"),
    (3, None, "transport=3: no such transport"),
])
def test_an_unknown_or_unbuilt_transport_is_refused_naming_where_it_came_from(monkeypatch, given,
                                                                               env, said):
    monkeypatch.delenv(settings.TRANSPORT_ENV, raising=False)
    if env is not None:
        monkeypatch.setenv(settings.TRANSPORT_ENV, env)
    with pytest.raises(ConfigError) as err:
        transports.choose(given)
    assert said in str(err.value)


def test_init_refuses_an_unknown_transport_before_it_opens_anything(monkeypatch):
    opened: list[str] = []
    monkeypatch.setattr(transports, "open_fabric", lambda name, **kw: opened.append(name))
    with pytest.raises(ConfigError, match="no such transport"):
        rxelab.init(0, 1, "127.0.0.1", 1, device="fake0", transport="infiniband")
    assert opened == []


def test_the_chosen_transport_is_the_one_opened_and_reported():
    def job(comm):
        x = np.arange(6, dtype=np.float32)
        y = np.empty_like(x)
        comm.allreduce(x, y)
        return comm.transport, type(comm.fabric).__name__, float(y[5])
    assert run_ranks(3, job, transport="tcp") == [("tcp", "TcpFabric", 15.0)] * 3


def test_ranks_that_disagree_on_the_transport_fail_in_init_naming_it():
    said = run_ranks(3, lambda comm: "started", keep_errors=True, timeout=5,
                     per_rank=lambda r: {"transport": "tcp", "device": None} if r == 2 else {})
    assert all(isinstance(s, ConfigError | PeerError) for s in said), said
    assert all("rank 2 has transport=tcp, rank 0 has transport=verbs" in str(s) for s in said), said


def test_the_disagreement_names_an_id_it_does_not_know():
    mine = {settings.TRANSPORT: 0}
    assert settings.disagreement(mine, {settings.TRANSPORT: 0}, 1) is None
    assert "rank 1 has transport=7, rank 0 has transport=verbs" in \
        str(settings.disagreement(mine, {settings.TRANSPORT: 7}, 1))
    assert "rank 1 has transport=None" in str(settings.disagreement(mine, {}, 1))


def test_an_elastic_job_keeps_its_transport_and_refuses_a_newcomer_with_another(monkeypatch):
    monkeypatch.setenv("RXELAB_JOB_TOKEN", SECRET)
    said: dict[str, BaseException] = {}

    def knock(port: int) -> None:
        try:
            rxelab.join("127.0.0.1", port, wait=20, device="fake0", transport="verbs")
        except BaseException as err:  # reported to the test
            said["newcomer"] = err

    def job(comm):
        t = None
        if comm.rank == 0:
            t = threading.Thread(target=knock, args=(comm.rendezvous[1],), daemon=True)
            t.start()
        comm.barrier()
        same = comm.admit(timeout=8, wanted=1)  # the refusal ends it; 8 s: a busy host
        if t is not None:
            t.join(20)
        return same is comm, same.transport, same.seat("test").opened["transport"]
    out = run_ranks(2, job, timeout=10, deadline=60, elastic=True, transport="tcp")
    assert out == [(True, "tcp", "tcp")] * 2, out
    err = said["newcomer"]
    assert isinstance(err, ConfigError) and "refused" in str(err) and "transport" in str(err), err

