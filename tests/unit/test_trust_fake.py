"""Who can get in (issue 27, items 1-4 and 7), tried as a local attacker would: ranks as
threads on the fake fabric, the real control plane on 127.0.0.1, the attacker a listener of
its own without the job's secret (tests/unit/impostors.py). Before the handshake, each of
these let the attacker in: it coordinated a shrink and falsified the job's sums, replayed a
rank's hello into another job, relayed the job from [::1], or kept a dead rank "alive"."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import numpy as np
import pytest
import rxelab
from pyverbs import _fabric
from rxelab.bootstrap import discover
from rxelab.control import addresses, framing, handshake
from rxelab.control.connection import Greeting, dial
from rxelab.control.handshake import SharedSecret
from rxelab.control.liveness import Verdict, probe
from rxelab.control.server import Server
from rxelab.errors import AuthError, ConfigError, PeerError, ProtocolError

from tests.unit.fakejob import die, free_port, run_ranks, settle
from tests.unit.impostors import Impostor, bind_when_free

SECRET = "JPrm-WjSNOqrWZ8HLGJnVaT8PRpWOIiXYT9TxA0tIKI"  # a job's secret: 256 bits


@pytest.fixture(autouse=True)
def secret(monkeypatch):
    monkeypatch.setenv("RXELAB_JOB_TOKEN", SECRET)


@pytest.fixture
def impostors():
    made: list[Impostor] = []
    yield made
    for imp in made:
        imp.close()


def until_failure(comm) -> None:
    with pytest.raises(PeerError):
        for _ in range(400):
            comm.allreduce(np.ones(64), np.empty(64))


def checked_sum(comm, me: int) -> float:
    """An allreduce of (original id + 1) over the members, checked by an allgather of ids."""
    ids = np.empty(comm.size, np.int64)
    comm.allgather(np.array([me], np.int64), ids)
    y = np.empty(64)
    comm.allreduce(np.full(64, me + 1.0), y)
    assert np.all(y == sum(int(i) + 1 for i in ids)), (y[0], ids)
    return float(y[0])


# ---- item 1: a stranger on rank 0's port after its death ------------------------------------
@pytest.mark.parametrize("silent", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["forged challenge", "silent"])
def test_a_stranger_on_rank_0s_port_after_it_died_cannot_take_the_shrink_over(impostors, silent):
    def job(comm):
        me = comm.rank
        settle(comm)
        if me == 0:
            port = comm.job.master_port
            die(comm)
            impostors.append(bind_when_free(("127.0.0.1", port), silent=silent))
            return None
        until_failure(comm)
        with comm.shrink(timeout=20) as new:
            return new.size, new.formed["lost"], checked_sum(new, me)
    out = run_ranks(3, job, timeout=20, deadline=90, elastic=True)
    assert out[1] == out[2] == (2, [0], 5.0), out
    (imp,) = impostors
    assert imp.connections > 0, "the survivors did knock at rank 0's old port"
    assert set(imp.heard) <= {"knock"}, f"the stranger was told more than a knock: {imp.heard}"


# ---- item 2: nothing a stranger captures can be replayed -------------------------------------
def _exchange(listener_cred: SharedSecret, dial_cred: SharedSecret, scope: str) -> tuple[bytes, bool]:
    """A connector's bytes to a listener that runs the handshake, and whether it passed."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        heard = bytearray()
        passed: list[bool] = []

        def serve() -> None:
            conn, _ = srv.accept()
            conn.settimeout(5)
            g = Greeting(listener_cred, lambda knock: None)
            buf = bytearray()
            with conn:
                try:
                    while (data := conn.recv(1 << 16)):
                        heard.extend(data)
                        buf += data
                        reply, request = g.step(buf)
                        if reply:
                            conn.sendall(reply)
                        if request is not None:
                            passed.append(True)
                            return
                except Exception:  # refused: the test looks at `passed`
                    passed.append(False)
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        try:
            link = dial(("127.0.0.1", port), dial_cred, kind="hello", rank=1, to=0, generation=0,
                        scope=scope, deadline=time.monotonic() + 5, connect_s=2)
            link.send({"type": "bye", "rank": 1} | {"type": "hello", "rank": 1, "world_size": 2,
                                                   "host": "x", "settings": {}, "listen": 0,
                                                   "generation": 0, "endpoints": {}})
            link.close()
        except AuthError:
            pass
        t.join(5)
        return bytes(heard), bool(passed and passed[0])


def _replay(data: bytes, cred: SharedSecret) -> bool:
    """Feed a captured connector's bytes to a fresh listener of the same secret: passed?"""
    g = Greeting(cred, lambda knock: None)
    buf = bytearray(data)
    try:
        _, request = g.step(buf)
    except Exception:
        return False
    return request is not None


def test_a_captured_exchange_is_worthless_in_this_job_and_any_other_with_the_secret():
    cred = SharedSecret.of(SECRET, "test")
    data, passed = _exchange(cred, cred, "rendezvous 29500 2")
    assert passed, "the genuine exchange passes"
    assert SECRET.encode() not in data and cred.key not in data
    assert not _replay(data, cred), "a replay to a listener of the same secret passed"
    _, passed = _exchange(cred, SharedSecret.of("a guess", "test"), "rendezvous 29500 2")
    assert not passed, "a guessed secret passed"


@pytest.mark.slow
def test_a_squatter_before_rank_0_hears_only_knocks_and_its_replays_join_no_later_job(impostors):
    """It binds the rendezvous first: the ranks never send it a hello (it cannot prove
    itself), and whatever it heard, replayed into a later job of the same secret, gets
    nobody in; that job forms with its own ranks only."""
    port = free_port()
    squat = Impostor(("127.0.0.1", port))
    impostors.append(squat)
    _fabric.FABRIC.reset(seed=0, max_delay=0.0002)
    # a rank of the job that cannot form: it tries for its timeout, then says why
    with pytest.raises(PeerError, match="does not hold this job's secret"):
        rxelab.init(1, 3, "127.0.0.1", port, device="fake0", timeout=2)
    deadline = time.monotonic() + 5
    while squat.connections < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    squat.close()
    assert set(squat.heard) <= {"knock"}, squat.heard
    captured = [r for r in squat.raw if r]
    assert captured

    replays: list[bool] = []

    def job(comm):
        if comm.rank == 0:  # while the job forms: the captured bytes, replayed to its port
            for data in captured:
                with socket.create_connection(("127.0.0.1", comm.job.master_port)) as s:
                    s.sendall(data)
                    s.settimeout(1)
                    try:
                        replays.append(b"table" in s.recv(1 << 16))
                    except (TimeoutError, OSError):
                        replays.append(False)
        return checked_sum(comm, comm.rank)
    out = run_ranks(3, job, timeout=20, elastic=True)
    assert out == [6.0, 6.0, 6.0] and replays and not any(replays)


# ---- item 3: [::1] beside an IPv4 rendezvous --------------------------------------------------
needs_ipv6 = pytest.mark.skipif(not socket.has_ipv6 or not addresses.addresses("::1", 1),
                                reason="this host has no IPv6 loopback")


@needs_ipv6
def test_a_secured_rank_0_holds_every_family_so_nobody_can_take_ipv6_beside_it():
    port = free_port()
    job = discover(0, 2, "localhost", port, env={"RXELAB_JOB_TOKEN": SECRET})
    with addresses.listen(job):
        with pytest.raises(OSError):
            Impostor(("::1", port), family=socket.AF_INET6, v6only=True)


@needs_ipv6
def test_ranks_pass_over_a_listener_on_ipv6_that_cannot_prove_itself(impostors, monkeypatch):
    """A rank 0 that could listen on IPv4 only (no dual stack) and a stranger on [::1]: the
    ranks dial localhost (::1 first), find the stranger cannot prove itself, and reach rank 0
    over IPv4; the stranger hears knocks and nothing else."""
    port = free_port()
    imp = Impostor(("::1", port), family=socket.AF_INET6, v6only=True)
    impostors.append(imp)
    monkeypatch.setattr(socket, "has_dualstack_ipv6", lambda: False)
    real = socket.getaddrinfo

    def v6_first(host, *args, **kw):  # as many hosts resolve localhost: ::1, then 127.0.0.1
        if host == "localhost":
            return real("::1", *args, **kw) + real("127.0.0.1", *args, **kw)
        return real(host, *args, **kw)
    monkeypatch.setattr(socket, "getaddrinfo", v6_first)
    _fabric.FABRIC.reset(seed=0, max_delay=0.0002)
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        try:
            with rxelab.init(r, 3, "localhost", port, device="fake0", timeout=20) as comm:
                results[r] = checked_sum(comm, r)
        except BaseException as err:
            results[r] = err
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {0: 6.0, 1: 6.0, 2: 6.0}, results
    assert imp.connections >= 2 and set(imp.heard) <= {"knock"}, imp.heard


# ---- item 4: a dead rank's port taken by a stranger ----------------------------------------
@pytest.mark.parametrize("silent", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["forged challenge", "silent"])
def test_a_stranger_on_a_dead_ranks_port_does_not_keep_it_alive(impostors, silent):
    def job(comm):
        me = comm.rank
        settle(comm)
        if me == 2:
            port = comm.control.server.port
            die(comm)
            impostors.append(bind_when_free(("127.0.0.1", port), silent=silent))
            return None
        until_failure(comm)
        started = time.monotonic()
        with comm.shrink(timeout=20) as new:
            return new.formed["lost"], checked_sum(new, me), time.monotonic() - started
    out = run_ranks(4, job, timeout=20, deadline=90, elastic=True)
    for r in (0, 1, 3):
        lost, total, took = out[r]
        assert lost == [2] and total == 7.0, out
        assert took < 12, f"the stranger held the shrink for {took:.1f} s"


# ---- item 7: a secret file must be the caller's own ------------------------------------------
def test_a_secret_file_of_another_user_is_refused_even_if_private(tmp_path, monkeypatch):
    path = tmp_path / "job.secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    env = {"RANK": "0", "WORLD_SIZE": "1", "RXELAB_JOB_TOKEN_FILE": str(path)}
    assert discover(env=env).secured
    monkeypatch.setattr("os.geteuid", lambda: path.stat().st_uid + 1)
    with pytest.raises(ConfigError, match="belongs to uid .* not to this process's user"):
        discover(env=env)


def test_frames_after_the_handshake_are_sealed_and_a_changed_one_is_refused():
    cred = SharedSecret.of(SECRET, "test")
    knock = {"type": "knock", "kind": "hello", "rank": 1, "to": 0, "generation": 0, "scope": "s",
             "nonce": handshake.nonce()}
    t = handshake.transcript(knock, handshake.nonce())
    key = cred.seal_key(t)
    sender, receiver = handshake.Session(key, handshake.CONNECTOR), handshake.Session(key, handshake.LISTENER)
    frame = framing.encode({"type": "bye", "rank": 1}, sender)
    assert framing.split_frame(frame, receiver) is not None
    replayed = framing.encode({"type": "bye", "rank": 1}, handshake.Session(key, handshake.CONNECTOR))
    with pytest.raises(Exception, match="failed its seal"):
        framing.split_frame(replayed, receiver)  # the first frame again: its number is spent
    changed = bytearray(framing.encode({"type": "bye", "rank": 1}, sender))
    changed[-40] ^= 1
    with pytest.raises(Exception, match="failed its seal"):
        framing.split_frame(bytes(changed), receiver)


# ---- a relay between ranks, or between jobs of one secret -----------------------------------
def _relay(target: tuple[str, int]) -> tuple[socket.socket, threading.Event]:
    """A stranger's listener that passes every byte on to `target` and back (it cannot read
    or change them: it only relays)."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(1 << 16):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            out = socket.create_connection(target)
            for a, b in ((conn, out), (out, conn)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    return srv, stop


def test_a_relay_from_a_dead_ranks_port_to_a_live_rank_does_not_make_it_alive():
    """The probe is bound to the rank it is for: rank 1's server answers for rank 1 only."""
    cred = SharedSecret.of(SECRET, "test")
    listener = addresses.any_address(0)
    server = Server(listener, cred, {"job"}, rank=1, generation=0)
    relay, stop = _relay(("127.0.0.1", server.port))
    try:
        where = ("127.0.0.1", relay.getsockname()[1])
        assert probe(where, cred, scope="job", rank=0, to=1, generation=0) == Verdict.ALIVE, \
            "a relay of rank 1's own probe is rank 1 answering"
        assert probe(where, cred, scope="job", rank=0, to=2, generation=0) != Verdict.ALIVE
        assert probe(("127.0.0.1", server.port), cred, scope="job", rank=0, to=2,
                     generation=0) != Verdict.ALIVE, "rank 1 answered for rank 2"
    finally:
        stop.set()
        relay.close()
        server.close(listener=True)


def test_two_jobs_of_one_secret_under_their_launchers_are_bound_apart():
    env = {"RXELAB_JOB_TOKEN": SECRET, "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    a = discover(1, 4, env={**env, "TORCHELASTIC_RUN_ID": "run-a"})
    b = discover(1, 4, env={**env, "TORCHELASTIC_RUN_ID": "run-b"})
    c = discover(1, 4, env={**env, "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"})
    assert len({a.scope(), b.scope(), c.scope()}) == 3
    assert "run-a" in a.scope() and "slurm-77.0" in c.scope()
    weird = discover(1, 4, env={**env, "TORCHELASTIC_RUN_ID": "x y;$(rm)" + "z" * 100})
    assert framing.SCHEMAS["knock"]["scope"][1](weird.scope()), "a launcher's id is kept printable"


def test_nothing_big_is_read_from_a_connection_before_it_proved_itself():
    """A stranger may not make a listener buffer or parse a large frame before the handshake
    (64 waiting connections of 1 MiB each, before)."""
    g = Greeting(SharedSecret.of(SECRET, "test"), lambda knock: None)
    buf = bytearray(framing.HEADER.pack(framing.MAGIC, framing.VERSION, 100_000))
    with pytest.raises(ProtocolError, match="exceeds the limit of 2048"):
        g.step(buf)
