"""How the ranks of a torch process group meet (rxelab.torch.rendezvous) and what the backend
takes as options (rxelab.torch.options): both pure Python (torch is here only because the
package registers the backend when imported). The store is a
stand-in with torch's Store calls (set, get, wait)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from rxelab.errors import ConfigError, PeerError, ProtocolError
from rxelab.torch import options as opts
from rxelab.torch import rendezvous as rdv


class Store:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str | bytes) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key: str) -> bytes:
        return self.data[key]

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        if any(k not in self.data for k in keys):
            raise RuntimeError(f"Wait timeout after {timeout}")


def test_rank_0_publishes_where_it_listens_and_a_secret_drawn_for_the_job():
    store = Store()
    job0, listener = rdv.meet(store, 0, 3, 5.0, env={"MASTER_ADDR": "10.0.0.1"})
    try:
        assert listener is not None and job0.master_port == listener.getsockname()[1]
        job2, none = rdv.meet(store, 2, 3, 5.0, env={})
        assert none is None
        assert (job2.master_addr, job2.master_port) == ("10.0.0.1", job0.master_port)
        assert job2.launch_id == job0.launch_id and job0.secured and job2.secured
        assert job2.credential.key == job0.credential.key, "one secret, from the store"
        assert job0.scope() == job2.scope()
    finally:
        listener.close()


def test_a_secret_of_rxelabs_own_never_goes_into_the_store():
    store = Store()
    token = "FCK2udXL7r8mUQ1WEU9OzXhH_oxxnGo-nfI7kFHR754"
    job0, listener = rdv.meet(store, 0, 2, 5.0, env={"RXELAB_JOB_TOKEN": token})
    listener.close()
    assert rdv.SECRET_KEY not in store.data
    assert token.encode() not in b"".join(store.data.values())
    job1, _ = rdv.meet(store, 1, 2, 5.0, env={"RXELAB_JOB_TOKEN": token})
    assert job1.credential.key == job0.credential.key
    with pytest.raises(ConfigError, match="rank 0 has a job secret .*this rank has none"):
        rdv.meet(store, 1, 2, 5.0, env={})


def test_a_rank_with_a_secret_where_rank_0_has_none_is_refused():
    store = Store()
    _, listener = rdv.meet(store, 0, 2, 5.0, env={})
    listener.close()
    with pytest.raises(ConfigError, match="this rank has a job secret"):
        rdv.meet(store, 1, 2, 5.0, env={"RXELAB_JOB_TOKEN": "mcrqjUkFUobGISH4H_HDn02d-ptZ9HkU7YvtviMaslg"})


def test_a_missing_rank_0_is_named_after_the_wait():
    with pytest.raises(PeerError, match="rank 0 did not publish its rendezvous .* within 0.5 s"):
        rdv.meet(Store(), 1, 2, 0.5, env={})


@pytest.mark.parametrize("value", [
    b"not json", b"[]", json.dumps({"host": "a b", "port": 1, "launch": "0" * 16, "secret": "x"}).encode(),
    json.dumps({"host": "h", "port": 70000, "launch": "0" * 16, "secret": "x"}).encode(),
    json.dumps({"host": "h", "port": True, "launch": "0" * 16, "secret": "x"}).encode(),
    json.dumps({"host": "h", "port": 5, "launch": "; rm -rf", "secret": "x"}).encode(),
    b"x" * 5000, b"\xff\xfe"])
def test_what_the_store_holds_is_checked_before_use(value):
    store = Store()
    store.set(rdv.WHERE_KEY, value)
    with pytest.raises(ProtocolError):
        rdv.meet(store, 1, 2, 1.0, env={})


def test_a_job_of_one_needs_no_rendezvous():
    job, listener = rdv.meet(Store(), 0, 1, 1.0, env={})
    assert listener is None and job.world_size == 1 and job.secured


@pytest.mark.parametrize("rank,size", [(3, 3), (-1, 2), (0, 0), (0, 20000)])
def test_ranks_outside_the_job_are_refused(rank, size):
    with pytest.raises(ConfigError):
        rdv.meet(Store(), rank, size, 1.0, env={})


def test_options_from_the_environment_and_from_pg_options():
    env = {"RXELAB_ALGORITHMS": "allreduce=recursive-doubling, alltoall=pairwise",
           "RXELAB_EAGER_LIMIT": "4096", "RXELAB_COMPRESSION": "lz4"}
    got = opts.resolve(None, env)
    assert got.algorithm("allreduce") == "recursive-doubling"
    assert got.algorithm("alltoallv") == "pairwise", "alltoallv takes alltoall's choice"
    assert got.algorithm("bcast") is None and got.settings == {"eager_limit": 4096}
    assert got.opening()["compression"] == "lz4"
    mine = opts.resolve(opts.Options(algorithms={"allreduce": "ring"}, compression="none",
                                     settings={"eager_limit": 0}), env)
    assert mine.algorithm("allreduce") == "ring" and mine.settings["eager_limit"] == 0
    assert mine.compression == "none", "pg_options win over the environment"


@pytest.mark.parametrize("env,match", [
    ({"RXELAB_ALGORITHMS": "allreduce"}, "collective=algorithm"),
    ({"RXELAB_ALGORITHMS": "allreduce=fastest"}, "allreduce has no algorithm 'fastest'"),
    ({"RXELAB_ALGORITHMS": "reduce=ring"}, "no collective 'reduce'"),
    ({"RXELAB_EAGER_LIMIT": "lots"}, "RXELAB_EAGER_LIMIT='lots'"),
    ({"RXELAB_EAGER_LIMIT": "99999999"}, "RXELAB_EAGER_LIMIT: eager_limit"),
    ({"RXELAB_COMPRESSION": "zip"}, "zip"),
])
def test_a_wrong_environment_is_named(env, match):
    with pytest.raises(ConfigError, match=match):
        opts.resolve(None, env)


def test_pg_options_of_another_kind_are_refused():
    with pytest.raises(ConfigError, match="rxelab.torch.Options"):
        opts.resolve({"compression": "lz4"}, {})  # type: ignore[arg-type]


def test_srun_and_mpirun_give_torchs_env_rendezvous_its_variables():
    slurm = {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_JOB_ID": "41",
             "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[1-3]"}
    got = rdv.torch_environment(slurm)
    assert got["RANK"] == "2" and got["WORLD_SIZE"] == "3" and got["MASTER_ADDR"] == "node1"
    assert 1 <= int(got["MASTER_PORT"]) <= 65535
    assert rdv.torch_environment({**slurm, "MASTER_PORT": "29500"}).get("MASTER_PORT") is None
    ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "h0"}
    assert rdv.torch_environment(ompi) == {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert rdv.torch_environment({**torchrun, **slurm}) == {}
    assert rdv.torch_environment({}) == {}, "no launcher: nothing made up"
    assert rdv.torch_environment({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == {}


def test_a_torch_without_libuv_gets_stores_it_can_make():
    """Debian 13's torch 2.6 has no libuv, and env:// and torchrun's stores ask for it."""
    import types

    import torch.distributed as dist

    if not hasattr(dist, "DistStoreError"):
        pytest.skip("torch 1.13's store takes no use_libuv")
    asked: list[object] = []

    class NoLibuv(dist.TCPStore):
        def __init__(self, *args, use_libuv=True, **kwargs):
            if len(args) > rdv.USE_LIBUV_AT:  # given by position, as torch's own takes it
                args, use_libuv = args[:rdv.USE_LIBUV_AT], args[rdv.USE_LIBUV_AT]
            asked.append(use_libuv)
            if use_libuv:
                raise dist.DistStoreError("use_libuv was requested but PyTorch was build without "
                                          "libuv support, run with USE_LIBUV=0 to disable it.")
            super().__init__(*args, use_libuv=False, **kwargs)

    torchs_own = types.SimpleNamespace(TCPStore=NoLibuv)  # a module that makes stores unasked
    with pytest.raises(dist.DistStoreError):
        torchs_own.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    rdv.stores_without_libuv([torchs_own])
    rdv.stores_without_libuv([torchs_own])  # once is enough: no wrapper around a wrapper
    asked.clear()
    store = torchs_own.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    store.set("k", "v")
    assert store.get("k") == b"v" and asked == [True, False], asked
    asked.clear()  # use_libuv by position (the 9th): turned, not given twice
    store = torchs_own.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30), False, False,
                                None, True)
    assert asked == [True, False], asked

    class Broken(dist.TCPStore):  # a libuv store that failed for another reason stands
        def __init__(self, *args, **kwargs):
            asked.append(kwargs.get("use_libuv", True))
            raise dist.DistStoreError("libuv: address already in use")

    broken = types.SimpleNamespace(TCPStore=Broken)
    rdv.stores_without_libuv([broken])
    asked.clear()
    with pytest.raises(dist.DistStoreError, match="address already in use"):
        broken.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    assert asked == [True]
    other = types.SimpleNamespace(TCPStore=dist.TCPStore)  # this torch's own, with libuv
    rdv.stores_without_libuv([other])
    assert other.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False).port > 0


def test_importing_the_backend_mends_the_store_a_torchrun_worker_makes(monkeypatch):
    """A torchrun worker reaches its agent's store through torch.distributed.rendezvous's
    TCPStore, made without saying use_libuv: on a torch without libuv `import rxelab.torch`
    must turn that default (the module by its name: as an attribute it is a function)."""
    import importlib

    import rxelab.torch
    import torch.distributed as dist

    if not hasattr(dist, "DistStoreError"):
        pytest.skip("torch 1.13's store takes no use_libuv")
    real = dist.TCPStore

    def no_libuv(*args, use_libuv=True, **kwargs):
        if use_libuv:
            raise dist.DistStoreError("use_libuv was requested but PyTorch was build without "
                                      "libuv support")
        return real(*args, use_libuv=False, **kwargs)

    module = importlib.import_module("torch.distributed.rendezvous")
    monkeypatch.setattr(dist, "TCPStore", no_libuv)
    monkeypatch.setattr(module, "TCPStore", no_libuv)
    importlib.reload(rxelab.torch)
    store = module.TCPStore(host_name="127.0.0.1", port=0, world_size=1, is_master=True,
                            wait_for_workers=False)
    store.set("k", "v")
    assert store.get("k") == b"v"
