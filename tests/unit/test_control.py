"""The TCP control plane on 127.0.0.1: rank 0 serves every joiner at once, drops what is
not of this job (another program, a stray process, garbage) and keeps going."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from rxelab import wire
from rxelab.bootstrap import JobInfo, discover
from rxelab.control import ControlPlane
from rxelab.errors import ConfigError, PeerError

from tests.unit.fakejob import free_port

GID = "0000:0000:0000:0000:0000:ffff:0a0a:000b"


def secret(text: str) -> str:
    """What a job of this secret sends in its hellos."""
    return discover(rank=0, world_size=1, env={"RXELAB_JOB_TOKEN": text}).token


TOK = secret("tok")


def endpoints(rank: int, world: int) -> dict[int, dict]:
    return {p: {"qpn": 100 + rank, "psn": p, "gid": GID, "lid": 0} for p in range(world) if p != rank}


def run_job(world: int, port: int, token: str = TOK, timeout: float = 10,
            before_joiners=None) -> dict[int, object]:
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        plane = ControlPlane(JobInfo(r, world, "127.0.0.1", port, "test", token), timeout)
        try:
            results[r] = plane.exchange(endpoints(r, world))
            plane.barrier()
        except Exception as err:  # reported per rank
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
        plane = ControlPlane(JobInfo(1, 2, "127.0.0.1", port, "test", secret("other-job")), 3)
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
        plane = ControlPlane(JobInfo(0, 3, "127.0.0.1", port, "test", TOK), 1.5)
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
    token = discover(env={**env, "RXELAB_JOB_TOKEN": "s3cret"}).token
    assert len(token) == 64 and "s3cret" not in token, "only a digest of the secret travels"


# ---- issue 15 item 6, issue 16 item 6: strangers on the control port ---------------------------
def hello(rank: int, world: int, token: str, eps: object = None) -> bytes:
    """A frame as a stranger writes it: by hand, not through our (validating) encoder."""
    body = json.dumps({"type": "hello", "rank": rank, "world_size": world, "host": "x",
                       "token": token, "settings": {}, "listen": 0, "generation": 0,
                       "endpoints": eps if eps is not None else
                       {str(k): v for k, v in endpoints(rank, world).items()}}).encode()
    return wire.HEADER.pack(wire.MAGIC, wire.VERSION, len(body)) + body


@pytest.mark.parametrize("stranger", [
    pytest.param(lambda: hello(1, 3, ""), id="right port and world size, no token"),
    pytest.param(lambda: hello(1, 3, secret("guess")), id="a guessed token"),
    pytest.param(lambda: hello(7, 3, TOK), id="a rank outside the world"),
    pytest.param(lambda: hello(1, 4, TOK), id="another world size (a stale process)"),
    pytest.param(lambda: hello(1, 3, TOK, {"0": {"2": endpoints(1, 3)[2]}, "2": endpoints(1, 3)[2]}),
                 id="a table-shaped endpoint"),
])
def test_a_stranger_is_dropped_and_the_job_completes(stranger):
    port = free_port()
    socks = []

    def intrude():
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(stranger())
        socks.append(s)
        time.sleep(0.3)

    results = run_job(3, port, before_joiners=intrude)
    leaked = b""
    for s in socks:
        s.settimeout(0.5)
        try:
            leaked += s.recv(1 << 16)
        except (TimeoutError, OSError):
            pass
        s.close()
    assert all(isinstance(results[r], dict) for r in range(3)), results
    assert b"qpn" not in leaked, "the stranger was sent the job's endpoints"


def test_without_a_secret_rank_0_listens_on_its_address_only():
    port = free_port()
    reachable: list[bool] = []

    def probe():
        for addr in ("127.0.0.1", "127.0.0.2"):
            try:
                socket.create_connection((addr, port), timeout=2).close()
                reachable.append(True)
            except OSError:
                reachable.append(False)

    results = run_job(2, port, token="", before_joiners=probe)
    assert all(isinstance(results[r], dict) for r in range(2)), results
    assert reachable == [True, False], "bound to MASTER_ADDR (127.0.0.1), not to every address"


def test_the_secret_comes_from_a_private_file_or_open_mpi(tmp_path):
    private = tmp_path / "job.secret"
    private.write_text("s3cret\n")
    private.chmod(0o600)
    base = {"RANK": "0", "WORLD_SIZE": "1"}
    from_file = discover(env={**base, "RXELAB_JOB_TOKEN_FILE": str(private)})
    assert from_file.token == secret("s3cret") and from_file.token_source == "RXELAB_JOB_TOKEN_FILE"
    private.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        discover(env={**base, "RXELAB_JOB_TOKEN_FILE": str(private)})
    with pytest.raises(ConfigError, match="RXELAB_JOB_TOKEN_FILE"):
        discover(env={**base, "RXELAB_JOB_TOKEN_FILE": str(tmp_path / "missing")})
    ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
            "OMPI_MCA_orte_precondition_transports": "3c7ba4114e40cf4f-3dfe2b82d46d028b"}
    job = discover(env=ompi)
    assert job.token == secret("3c7ba4114e40cf4f-3dfe2b82d46d028b") and "Open MPI" in job.token_source
    assert discover(env={"RANK": "0", "WORLD_SIZE": "1"}).token == ""


def test_silent_connections_are_dropped_and_cannot_crowd_the_job_out(monkeypatch):
    """Before, a connection that never said hello was kept until the job's own deadline, and
    each took a descriptor: enough of them and real ranks could not get in."""
    from rxelab import control

    monkeypatch.setattr(control, "HELLO_S", 0.5)
    monkeypatch.setattr(control, "MAX_PENDING", 8)
    port = free_port()
    idle: list[socket.socket] = []

    def crowd():
        for _ in range(20):
            idle.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(1.0)

    results = run_job(3, port, before_joiners=crowd)
    assert all(isinstance(results[r], dict) for r in range(3)), results
    closed = 0
    for s in idle:
        s.settimeout(1)
        try:
            closed += s.recv(1) == b""
        except OSError:
            closed += 1
        s.close()
    assert closed == len(idle), "every silent connection was dropped"


def test_a_name_that_resolves_to_loopback_here_only_is_served_on_every_interface(monkeypatch):
    """MASTER_ADDR=$(hostname) on Debian: 127.0.1.1 here, the real address elsewhere. Binding
    loopback would leave every other host outside (the job would wait out its timeout)."""
    from rxelab import control

    port = free_port()
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, p, **kw: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.1.1", p))])
    with control.listen(JobInfo(0, 2, "myhost", port, "test", "")) as s:
        assert s.getsockname()[0] == "0.0.0.0"
    with control.listen(JobInfo(0, 2, "127.0.0.1", port, "test", "")) as s:
        assert s.getsockname()[0] == "127.0.1.1", "a loopback address named as such stays one"
