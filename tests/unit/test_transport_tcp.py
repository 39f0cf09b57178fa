"""The tcp transport's own promises, beside the collectives' matrix (test_collectives_fake.py
runs every algorithm over it): data connections only between ranks that proved the job's
secret, writes placed while the target is elsewhere, a dead peer named, and its I/O thread
never left asleep by a lost wake-up."""

from __future__ import annotations

import time

import numpy as np
import pytest
import rxelab
from rxelab.control.handshake import SharedSecret
from rxelab.errors import AuthError, ConfigError, PeerError
from rxelab.registry import Registry
from rxelab.transports import base
from rxelab.transports.outbox import Outbox
from rxelab.transports.tcp import TcpFabric

from tests.unit.fakejob import die, in_threads, run_ranks

SLOTS, SLOT = 4, 256


def meeting(rank: int, secret: str = "s3cret-of-the-job-0123456789abcdef", **kw) -> base.Meeting:
    return base.Meeting(rank, 0, kw.get("scope", "job"), SharedSecret.of(secret, "test"),
                        time.monotonic() + kw.get("within", 10.0), 16, 7)


def two_fabrics(secrets=("a-secret-of-this-job-0123456789", "a-secret-of-this-job-0123456789"),
                scopes=("job", "job"), within=10.0):
    fabrics = [TcpFabric("127.0.0.1", "127.0.0.1") for _ in range(2)]
    registries = [Registry(f.register, 1 << 30) for f in fabrics]
    conns = [f.connection(registries[r], 1 - r, SLOTS, 8, SLOT) for r, f in enumerate(fabrics)]
    eps = [f.endpoint.to_dict() for f in fabrics]
    out = in_threads(2, lambda r: fabrics[r].connect(
        {1 - r: eps[1 - r]}, meeting(r, secrets[r], scope=scopes[r], within=within)),
        deadline=30, keep_errors=True)
    return fabrics, conns, out


def poll_until(fabric: TcpFabric, n: int, within: float = 10.0) -> list[base.Completion]:
    got: list[base.Completion] = []
    end = time.monotonic() + within
    while len(got) < n and time.monotonic() < end:
        got.extend(fabric.device.cq.poll(16)[1])
        time.sleep(0.001)
    return got


def test_a_write_lands_while_the_target_does_nothing():
    fabrics, conns, out = two_fabrics()
    try:
        assert out == [None, None]
        src = np.arange(100_000, dtype=np.uint8) % 253
        dst = np.zeros_like(src)
        s = fabrics[0].register(src.ctypes.data, src.nbytes, base.ACCESS_REMOTE)
        d = fabrics[1].register(dst.ctypes.data, dst.nbytes, base.ACCESS_REMOTE)
        conns[0].post(7, base.WR_RDMA_WRITE, src.ctypes.data, src.nbytes, s.lkey,
                      dst.ctypes.data, d.rkey)
        done = poll_until(fabrics[0], 1)  # rank 1's thread is not involved at all
        assert [(c.wr_id, c.status) for c in done] == [(7, base.WC_SUCCESS)]
        assert np.array_equal(src, dst)
        d.close()  # revoked: a later write fails at its sender, nothing lands
        dst[:] = 0
        conns[0].post(8, base.WR_RDMA_WRITE, src.ctypes.data, 10, s.lkey, dst.ctypes.data, d.rkey)
        done = poll_until(fabrics[0], 1 + SLOTS)  # and the connection is in error: its
        assert [(c.wr_id, c.status) for c in done] == [(8, base.WC_REM_ACCESS_ERR)] + [
            ((1 << 32) | slot, base.WC_WR_FLUSH_ERR) for slot in range(SLOTS)]  # receives flush
        assert not dst.any()
    finally:
        for f in fabrics:
            f.close()


def test_a_peer_without_the_jobs_secret_gets_no_data_connection():
    fabrics, _, out = two_fabrics(secrets=("a-secret-of-this-job-0123456789",
                                           "another-jobs-secret-0123456789"), within=3.0)
    try:
        # rank 0 dials rank 1: it finds a listener without the secret; rank 1 is never reached
        assert isinstance(out[0], AuthError) and "does not hold this job's secret" in str(out[0])
        assert isinstance(out[1], PeerError) and "rank 0 never connected" in str(out[1]), out
    finally:
        for f in fabrics:
            f.close()


def test_a_peer_of_another_job_gets_no_data_connection():
    fabrics, _, out = two_fabrics(scopes=("job", "another job"), within=3.0)
    try:
        assert all(isinstance(o, PeerError | AuthError) for o in out), out
    finally:
        for f in fabrics:
            f.close()


def test_a_peer_whose_connection_breaks_is_named_by_the_collective_waiting_for_it():
    def job(comm):
        comm.barrier()
        if comm.rank == 1:
            die(comm)  # vanish without a goodbye, as a killed process
            return "gone"
        try:
            comm.alltoall(np.zeros(3 * 10_000, np.uint8), np.zeros(3 * 10_000, np.uint8))
        except PeerError as err:
            return err.peer
        return "no error"
    out = run_ranks(3, job, transport="tcp", keep_errors=True, timeout=10, deadline=60)
    assert out[1] == "gone" and 1 in out, out


def test_a_one_sided_write_then_a_barrier_does_not_wait_for_the_targets_progress():
    def job(comm):
        target = np.zeros(1000, np.uint8)
        comm.expose(target, (comm.rank - 1) % 2)
        remote = comm.remote((comm.rank + 1) % 2)
        if comm.rank == 0:
            comm.write(np.full(1000, 5, np.uint8), remote)  # completes once placed
        comm.barrier()  # rank 1 waits here on the control plane only
        return int(target.sum())
    assert run_ranks(2, job, transport="tcp") == [0, 5000]


def test_rdma_port_settings_and_an_address_it_cannot_listen_on_are_refused():
    with pytest.raises(ConfigError, match="gid_index= choose an RDMA port"):
        rxelab.init(0, 1, "127.0.0.1", 1, transport="tcp", gid_index=1)
    with pytest.raises(ConfigError, match="transport tcp cannot listen on '192.0.2.1'"):
        rxelab.init(0, 1, "127.0.0.1", 1, transport="tcp", device="192.0.2.1")


def test_a_poke_during_the_threads_read_of_the_pokes_is_never_lost(monkeypatch):
    """The rule: while the flag is up, a byte waits in the wake socket (or the poster's work
    is in the write pass that follows). A poke that lands while the thread reads the pokes
    must not leave the flag up with nothing to read."""
    f = TcpFabric("127.0.0.1", "127.0.0.1")
    try:
        f.poke()
        real = f._wake_r.recv

        def recv_with_a_poke_between(n):
            f.poke()  # a caller's post lands now
            return real(n)
        monkeypatch.setattr(f, "_wake_r", type("W", (), {"recv": staticmethod(recv_with_a_poke_between)})())
        f._woken()
        monkeypatch.undo()
        if f.poked:
            f._wake_r.setblocking(False)
            assert f._wake_r.recv(16), "the flag is up and no byte will wake the thread"
    finally:
        f.close()



def test_the_outbox_finishes_a_frame_it_began_and_drops_those_it_did_not():
    box = Outbox()
    box.add([[b"h" * 32, memoryview(b"p" * 100)], [b"H" * 32], [b"x" * 32, memoryview(b"y" * 50)]])
    assert box.bytes == 246
    box.taken(40)  # the first header and 8 bytes of its payload
    assert box.begun and box.bytes == 206
    box.cut()  # the connection went to error: the rest of the first frame, nothing after it
    assert [bytes(v) for f in box.frames for v in f] == [b"p" * 92] and box.bytes == 92
    box.taken(92)
    assert not box and not box.begun
    box.add([[b"a" * 32]])
    box.cut()  # nothing begun: nothing kept
    assert not box and box.bytes == 0
