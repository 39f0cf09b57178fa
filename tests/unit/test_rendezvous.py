"""The TCP control plane on 127.0.0.1: rank 0 serves every joiner at once, drops what is
not of this job (another program, a stray process, garbage) and keeps going."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from rxelab import wire
from rxelab.bootstrap import JobInfo, discover
from rxelab.errors import ConfigError, PeerError
from rxelab.rendezvous import ControlPlane

from tests.unit.fakejob import free_port

GID = "0000:0000:0000:0000:0000:ffff:0a0a:000b"


def endpoints(rank: int, world: int) -> dict[int, dict]:
    return {p: {"qpn": 100 + rank, "psn": p, "gid": GID, "lid": 0} for p in range(world) if p != rank}


def run_job(world: int, port: int, token: str = "tok", timeout: float = 10,
            before_joiners=None) -> dict[int, object]:
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        plane = ControlPlane(JobInfo(r, world, "127.0.0.1", port, "test", token), timeout)
        try:
            results[r] = plane.exchange(endpoints(r, world))
            plane.barrier()
        except Exception as err:  # noqa: BLE001 - reported per rank
            results[r] = err
        finally:
            plane.close()

    threads = [threading.Thread(target=rank, args=(0,), daemon=True)]
    threads[0].start()
    time.sleep(0.3)
    if before_joiners:
        before_joiners()
    threads += [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(1, world)]
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


def test_an_idle_connection_an_http_probe_and_garbage_do_not_stop_the_job():
    port = free_port()
    strays = []

    def nuisances():
        idle = socket.create_connection(("127.0.0.1", port))  # says nothing, ever
        http = socket.create_connection(("127.0.0.1", port))
        http.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        junk = socket.create_connection(("127.0.0.1", port))
        junk.sendall(wire.HEADER.pack(wire.MAGIC, wire.VERSION, 9) + b"[[[[[[[[[")
        strays.extend([idle, http, junk])

    started = time.monotonic()
    results = run_job(3, port, before_joiners=nuisances)
    for s in strays:
        s.close()
    assert all(isinstance(results[r], dict) for r in range(3)), results
    assert results[1][0]["qpn"] == 100 and results[0][2]["qpn"] == 102
    assert time.monotonic() - started < 8, "served at once, not after the idle one's timeout"


def test_a_process_of_another_job_cannot_join():
    port = free_port()

    def stranger():
        plane = ControlPlane(JobInfo(1, 2, "127.0.0.1", port, "test", "other-job"), 3)
        with pytest.raises(PeerError):
            plane.exchange(endpoints(1, 2))
        plane.close()

    t = threading.Thread(target=stranger, daemon=True)
    results = run_job(2, port, before_joiners=lambda: (t.start(), time.sleep(0.5)))
    t.join(5)
    assert all(isinstance(results[r], dict) for r in range(2)), results


def test_missing_ranks_are_named_with_what_was_dropped():
    port = free_port()
    result: list[object] = []

    def root():
        plane = ControlPlane(JobInfo(0, 3, "127.0.0.1", port, "test", "tok"), 1.5)
        try:
            plane.exchange(endpoints(0, 3))
        except PeerError as err:
            result.append(str(err))
        plane.close()

    t = threading.Thread(target=root, daemon=True)
    t.start()
    time.sleep(0.3)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        t.join(10)
    assert result and "ranks [1, 2] did not join within 1.5 s" in result[0], result
    assert "not an rxelab message" in result[0]


def test_a_port_in_use_is_named():
    with socket.create_server(("", 0)) as busy:
        port = busy.getsockname()[1]
        plane = ControlPlane(JobInfo(0, 2, "127.0.0.1", port, "test", ""), 2)
        with pytest.raises(ConfigError, match=f"rank 0 cannot listen on port {port}"):
            plane.exchange(endpoints(0, 2))


def test_under_torchrun_the_store_port_is_left_to_torch():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n1", "MASTER_PORT": "29500",
           "TORCHELASTIC_RUN_ID": "abc"}
    assert discover(env=env).master_port == 29501
    assert discover(env={**env, "RXELAB_MASTER_PORT": "4000"}).master_port == 4000
    assert discover(env={**env, "RXELAB_JOB_TOKEN": "s3cret"}).token == "s3cret"
