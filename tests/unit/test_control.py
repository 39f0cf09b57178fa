"""The TCP control plane on 127.0.0.1: rank 0 serves every joiner at once, drops what is
not of this job (another program, a stray process, garbage) and keeps going."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from rxelab.bootstrap import JobInfo, discover
from rxelab.control import addresses, framing
from rxelab.control.connection import dial
from rxelab.control.handshake import OPEN, SharedSecret
from rxelab.control.plane import ControlPlane
from rxelab.errors import AuthError, ConfigError, PeerError

from tests.unit.fakejob import free_port

GID = "0000:0000:0000:0000:0000:ffff:0a0a:000b"


def secret(text: str) -> SharedSecret:
    """What the ranks of a job of this secret prove themselves with."""
    return SharedSecret.of(text, "test")


TOK = secret("tok")


def endpoints(rank: int, world: int) -> dict[int, dict]:
    return {p: {"qpn": 100 + rank, "psn": p, "gid": GID, "lid": 0} for p in range(world) if p != rank}


def run_job(world: int, port: int, token: SharedSecret = TOK, timeout: float = 10,
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
        junk.sendall(framing.HEADER.pack(framing.MAGIC, framing.VERSION, 9) + b"[[[[[[[[[")
        strays.extend([idle, http, junk])

    started = time.monotonic()
    results = run_job(3, port, before_joiners=nuisances)
    for s in strays:
        s.close()
    assert all(isinstance(results[r], dict) for r in range(3)), results
    assert results[1][0]["qpn"] == 100 and results[0][2]["qpn"] == 102
    assert time.monotonic() - started < 8, "served at once, not after the idle one's timeout"


@pytest.mark.slow
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
    assert "RXELAB_TIMEOUT" in result[0], "the wait names the setting that extends it"


def test_a_port_in_use_is_named():
    with socket.create_server(("", 0)) as busy:
        port = busy.getsockname()[1]
        plane = ControlPlane(JobInfo(0, 2, "127.0.0.1", port, "test", OPEN), 2)
        with pytest.raises(ConfigError, match=f"rank 0 cannot listen on port {port}"):
            plane.exchange(endpoints(0, 2))


def test_under_torchrun_the_store_port_is_left_to_torch():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n1", "MASTER_PORT": "29500",
           "TORCHELASTIC_RUN_ID": "abc"}
    assert discover(env=env).master_port == 29501
    assert discover(env={**env, "RXELAB_MASTER_PORT": "4000"}).master_port == 4000
    strong = "FCK2udXL7r8mUQ1WEU9OzXhH_oxxnGo-nfI7kFHR754"
    cred = discover(env={**env, "RXELAB_JOB_TOKEN": strong}).credential
    assert cred.secured and strong not in repr(cred) and strong.encode() not in cred.key, \
        "the secret itself is not kept"


# ---- issue 15 item 6, issue 16 item 6, issue 27: strangers on the control port -------------
def raw_hello(rank: int = 1, world: int = 3) -> bytes:
    """A hello as a stranger writes it, by hand, with no handshake before it."""
    body = json.dumps({"type": "hello", "rank": rank, "world_size": world, "host": "x",
                       "settings": {}, "listen": 0, "generation": 0,
                       "endpoints": {str(k): v for k, v in endpoints(rank, world).items()}}).encode()
    return framing.HEADER.pack(framing.MAGIC, framing.VERSION, len(body)) + body


def knock_bytes(world: int = 3, port: int = 0) -> bytes:
    return framing.encode({"type": "knock", "kind": "hello", "rank": 1, "to": 0, "generation": 0,
                        "scope": f"rendezvous {port} {world}", "nonce": "ab" * 32})


def proven_hello(port: int, credential: SharedSecret, rank: int, world: int,
                 scope_world: int | None = None) -> socket.socket | None:
    """A process that dials with `credential` and says a hello: the socket, or None when the
    handshake failed (rank 0 did not prove itself, or dropped us)."""
    try:
        link = dial(("127.0.0.1", port), credential, kind="hello", rank=rank, to=0, generation=0,
                    scope=f"rendezvous {port} {scope_world or world}",
                    deadline=time.monotonic() + 3, connect_s=2)
    except (AuthError, OSError, PeerError):
        return None
    try:
        link.send({"type": "hello", "rank": rank, "world_size": world, "host": "x", "settings": {},
                   "listen": 0, "generation": 0,
                   "endpoints": {str(k): v for k, v in endpoints(rank, world).items()}})
    except OSError:
        return None
    return link.sock


def heard_by(socks: list[socket.socket]) -> bytes:
    """Everything the strangers' connections were sent, then closed."""
    leaked = b""
    for s in socks:
        s.settimeout(0.5)
        try:
            while chunk := s.recv(1 << 16):
                leaked += chunk
        except (TimeoutError, OSError):
            pass
        s.close()
    return leaked


STRANGERS = {
    "a hello without the handshake": lambda port: raw_hello(),
    "a knock and then a forged proof": lambda port: knock_bytes(3, port) + framing.encode(
        {"type": "proof", "proof": "cd" * 32}),
    "garbage after a knock": lambda port: knock_bytes(3, port) + b"GET / HTTP/1.1\r\n\r\n",
}


@pytest.mark.parametrize("stranger", sorted(STRANGERS))
def test_a_stranger_is_dropped_and_the_job_completes(stranger):
    port = free_port()
    socks = []

    def intrude():
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(STRANGERS[stranger](port))
        socks.append(s)
        time.sleep(0.3)

    results = run_job(3, port, before_joiners=intrude)
    leaked = heard_by(socks)
    assert all(isinstance(results[r], dict) for r in range(3)), results
    assert b"qpn" not in leaked and b"table" not in leaked, "the stranger was sent the job's endpoints"


@pytest.mark.parametrize("who", ["a guessed secret", "a rank outside the world",
                                 "another world size (a stale process)"])
def test_a_process_that_cannot_prove_itself_or_does_not_fit_is_dropped(who):
    """A guessed secret fails the handshake; a proven process of another job shape (a stale
    process of the same secret) is refused at its hello; either way the job forms and the
    stranger hears nothing of it."""
    port = free_port()
    socks: list[socket.socket | None] = []

    def intrude():
        if who == "a guessed secret":
            socks.append(proven_hello(port, secret("guess"), 1, 3))
        elif who == "a rank outside the world":
            socks.append(proven_hello(port, TOK, 7, 3, scope_world=3))
        else:
            socks.append(proven_hello(port, TOK, 1, 4, scope_world=3))
        time.sleep(0.3)

    results = run_job(3, port, before_joiners=intrude)
    assert all(isinstance(results[r], dict) for r in range(3)), results
    leaked = heard_by([s for s in socks if s is not None])
    assert b"qpn" not in leaked, "the stranger was sent the job's endpoints"
    if who == "a guessed secret":
        assert socks == [None], "a guessed secret never gets past the handshake"


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

    results = run_job(2, port, token=OPEN, before_joiners=probe)
    assert all(isinstance(results[r], dict) for r in range(2)), results
    assert reachable == [True, False], "bound to MASTER_ADDR (127.0.0.1), not to every address"


def test_the_secret_comes_from_a_private_file_or_open_mpi(tmp_path):
    private = tmp_path / "job.secret"
    private.write_text("xwqQzZ5nX8C6Dme2EUtD2PDR7NihV6oM4nHBGXlq-cU\n")
    private.chmod(0o600)
    base = {"RANK": "0", "WORLD_SIZE": "1"}
    from_file = discover(env={**base, "RXELAB_JOB_TOKEN_FILE": str(private)})
    assert from_file.credential.key == secret("xwqQzZ5nX8C6Dme2EUtD2PDR7NihV6oM4nHBGXlq-cU").key
    assert from_file.credential.source == "RXELAB_JOB_TOKEN_FILE"
    private.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        discover(env={**base, "RXELAB_JOB_TOKEN_FILE": str(private)})
    with pytest.raises(ConfigError, match="RXELAB_JOB_TOKEN_FILE"):
        discover(env={**base, "RXELAB_JOB_TOKEN_FILE": str(tmp_path / "missing")})
    ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
            "OMPI_MCA_orte_precondition_transports": "3c7ba4114e40cf4f-3dfe2b82d46d028b"}
    job = discover(env=ompi)
    assert job.credential.key == secret("3c7ba4114e40cf4f-3dfe2b82d46d028b").key
    assert "Open MPI" in job.credential.source
    assert not discover(env={"RANK": "0", "WORLD_SIZE": "1"}).secured


def test_silent_connections_are_dropped_and_cannot_crowd_the_job_out(monkeypatch):
    """Before, a connection that never said hello was kept until the job's own deadline, and
    each took a descriptor: enough of them and real ranks could not get in."""

    from rxelab.control import server
    monkeypatch.setattr(server, "PATIENCE_S", 0.5)
    monkeypatch.setattr(server, "MAX_PENDING", 8)
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
    port = free_port()
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, p, **kw: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.1.1", p))])
    with addresses.listen(JobInfo(0, 2, "myhost", port, "test", OPEN)) as s:
        assert s.getsockname()[0] == "0.0.0.0"
    with addresses.listen(JobInfo(0, 2, "127.0.0.1", port, "test", OPEN)) as s:
        assert s.getsockname()[0] == "127.0.1.1", "a loopback address named as such stays one"
