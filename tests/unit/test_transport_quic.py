"""The quic transport's own promises, beside the collectives' matrix (test_collectives_fake.py
runs every algorithm over it): a certificate every rank of a job derives alike and no one
else can present, a client that proves the job's secret before anything it sends is read,
writes placed while the target is elsewhere, and its settings checked in words."""

from __future__ import annotations

import socket
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("aioquic")

from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, StreamDataReceived
from cryptography.hazmat.primitives.serialization import Encoding
from rxelab import transports
from rxelab.control import (
    framing,
    handshake,
)
from rxelab.control.handshake import SharedSecret
from rxelab.control.munge_credential import MungeCredential
from rxelab.errors import AuthError, ConfigError, PeerError
from rxelab.registry import Registry
from rxelab.transports import base, quic_config, wire
from rxelab.transports.quic import QuicFabric
from rxelab.transports.quic_config import SEALABLE, datagram_size, sealable

from tests.unit.fakejob import in_threads

SLOTS, SLOT = 4, 256
SECRET = "a-secret-of-this-job-0123456789"


def meeting(rank: int, credential, scope: str = "job", within: float = 10.0) -> base.Meeting:
    return base.Meeting(rank, 0, scope, credential, time.monotonic() + within, 16, 7)


def two_fabrics(secrets=(SECRET, SECRET), scopes=("job", "job"), within=10.0):
    fabrics = [QuicFabric("127.0.0.1", "127.0.0.1", "reno") for _ in range(2)]
    registries = [Registry(f.register, 1 << 30) for f in fabrics]
    conns = [f.connection(registries[r], 1 - r, SLOTS, 8, SLOT) for r, f in enumerate(fabrics)]
    eps = [f.endpoint.to_dict() for f in fabrics]
    out = in_threads(2, lambda r: fabrics[r].connect(
        {1 - r: eps[1 - r]}, meeting(r, SharedSecret.of(secrets[r], "test"), scopes[r], within)),
        deadline=30, keep_errors=True)
    return fabrics, conns, out


def poll_until(fabric: QuicFabric, n: int, within: float = 10.0) -> list[base.Completion]:
    got: list[base.Completion] = []
    end = time.monotonic() + within
    while len(got) < n and time.monotonic() < end:
        got.extend(fabric.device.cq.poll(16)[1])
        time.sleep(0.001)
    return got


def der(secret: str, scope: str) -> bytes:
    return quic_config.certificate(SharedSecret.of(secret, "t"), scope)[0].public_bytes(Encoding.DER)


def test_every_rank_derives_the_jobs_certificate_alike_and_no_other_job_does():
    assert der(SECRET, "job-1") == der(SECRET, "job-1")
    assert der(SECRET, "job-1") != der("another-secret-0123456789", "job-1")
    assert der(SECRET, "job-1") != der(SECRET, "job-2")


def test_a_credential_that_shares_no_key_cannot_run_quic():
    with pytest.raises(ConfigError, match="needs a job secret to derive its certificate"):
        quic_config.certificate(MungeCredential(), "job")


def test_a_write_lands_while_the_target_does_nothing_and_not_once_revoked():
    fabrics, conns, out = two_fabrics()
    try:
        assert out == [None, None]
        src = np.arange(300_000, dtype=np.uint8) % 253
        dst = np.zeros_like(src)
        s = fabrics[0].register(src.ctypes.data, src.nbytes, base.ACCESS_REMOTE)
        d = fabrics[1].register(dst.ctypes.data, dst.nbytes, base.ACCESS_REMOTE)
        conns[0].post(7, base.WR_RDMA_WRITE, src.ctypes.data, src.nbytes, s.lkey,
                      dst.ctypes.data, d.rkey)
        done = poll_until(fabrics[0], 1)  # rank 1's thread is not involved at all
        assert [(c.wr_id, c.status) for c in done] == [(7, base.WC_SUCCESS)]
        assert np.array_equal(src, dst)
        d.close()
        dst[:] = 0
        conns[0].post(8, base.WR_RDMA_WRITE, src.ctypes.data, 10, s.lkey, dst.ctypes.data, d.rkey)
        done = poll_until(fabrics[0], 1 + SLOTS)
        assert [(c.wr_id, c.status) for c in done] == [(8, base.WC_REM_ACCESS_ERR)] + [
            ((1 << 32) | slot, base.WC_WR_FLUSH_ERR) for slot in range(SLOTS)]
        assert not dst.any()
    finally:
        for f in fabrics:
            f.close()


def test_a_server_without_the_jobs_secret_cannot_present_the_jobs_certificate():
    fabrics, _, out = two_fabrics(secrets=(SECRET, "another-jobs-secret-0123456789"), within=4.0)
    try:  # rank 0 is the client: TLS fails on the pinned certificate; rank 1 hears no proof
        assert isinstance(out[0], AuthError) and "does not hold this job's secret" in str(out[0])
        assert isinstance(out[1], PeerError) and "rank 0 never connected" in str(out[1]), out
    finally:
        for f in fabrics:
            f.close()


def test_a_peer_of_another_job_gets_no_data_connection():
    fabrics, _, out = two_fabrics(scopes=("job", "another job"), within=4.0)
    try:
        assert all(isinstance(o, PeerError | AuthError) for o in out), out
    finally:
        for f in fabrics:
            f.close()


class Intruder:
    """A QUIC client that has the job's certificate (say, it was copied) but not its secret:
    it knocks, forges its proof, then sends a write frame at once."""

    def __init__(self, server: tuple[str, int]) -> None:
        client, _ = quic_config.configurations(SharedSecret.of(SECRET, "t"), "job",
                                            congestion="reno", idle_s=10, datagram=1452)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.02)
        self.server = server
        self.quic = QuicConnection(configuration=client)
        self.quic.connect(server, time.monotonic())
        self.stream = self.quic.get_next_available_stream_id()
        self.heard = bytearray()
        self.closed = False

    def run(self, knock: bytes, then: bytes, within: float) -> None:
        self.quic.send_stream_data(self.stream, knock)
        sent_rest = False
        end = time.monotonic() + within
        while time.monotonic() < end and not self.closed:
            for data, addr in self.quic.datagrams_to_send(time.monotonic()):
                self.sock.sendto(data, addr)
            try:
                data, addr = self.sock.recvfrom(65536)
                self.quic.receive_datagram(data, addr, time.monotonic())
            except TimeoutError:
                timer = self.quic.get_timer()
                if timer is not None and timer <= time.monotonic():
                    self.quic.handle_timer(time.monotonic())
            while (event := self.quic.next_event()) is not None:
                if isinstance(event, StreamDataReceived):
                    self.heard += event.data
                elif isinstance(event, ConnectionTerminated):
                    self.closed = True
            if self.heard and not sent_rest:  # the challenge came: a forged proof, then data
                self.quic.send_stream_data(self.stream, then)
                sent_rest = True
        self.sock.close()


def test_a_client_with_the_certificate_but_not_the_secret_gets_nothing_read_or_placed():
    server = QuicFabric("127.0.0.1", "127.0.0.1", "reno")
    conn = server.connection(Registry(server.register, 1 << 30), 0, SLOTS, 8, SLOT)
    target = np.zeros(4096, dtype=np.uint8)
    key = server.register(target.ctypes.data, target.nbytes, base.ACCESS_REMOTE)
    knock = framing.encode({"type": "knock", "kind": "data", "rank": 0, "to": 1,
                            "generation": 0, "scope": "job", "nonce": handshake.nonce()})
    forged = framing.encode({"type": "proof", "proof": "ab" * 32})
    frame = wire.HEADER.pack(wire.WRITE, 0, 0, 0, key.rkey, 16, target.ctypes.data, 0)
    intruder = Intruder(("127.0.0.1", server.endpoint.port))
    done: list[BaseException | None] = []
    waiting = threading.Thread(target=lambda: done.append(_connect(server, within=4.0)))
    waiting.start()
    try:
        intruder.run(knock, forged + frame + b"\xff" * 16, within=4.0)
        waiting.join(10)
        assert intruder.heard, "the server answered the knock with its challenge"
        assert intruder.closed, "and hung up on the forged proof"
        assert not target.any(), "nothing it sent after the knock was placed"
        assert not conn.proven
        assert isinstance(done[0], PeerError) and "rank 0 never connected" in str(done[0])
    finally:
        server.close()


def _connect(fabric: QuicFabric, within: float) -> BaseException | None:
    try:
        fabric.connect({}, meeting(1, SharedSecret.of(SECRET, "test"), within=within))
    except BaseException as err:
        return err
    return None


def test_congestion_control_is_chosen_by_the_environment_and_checked(monkeypatch):
    monkeypatch.delenv("RXELAB_CONGESTION", raising=False)
    assert transports.congestion() == "reno"
    monkeypatch.setenv("RXELAB_CONGESTION", "cubic")
    assert transports.congestion() == "cubic"
    fabric = transports.open_fabric("quic", device="127.0.0.1", port=None, gid_index=None,
                                    cq_depth=64, toward="127.0.0.1")
    try:
        assert isinstance(fabric, QuicFabric) and fabric.congestion == "cubic"
    finally:
        fabric.close()
    monkeypatch.setenv("RXELAB_CONGESTION", "bbr")
    with pytest.raises(ConfigError, match="RXELAB_CONGESTION='bbr': quic has no such congestion"):
        transports.load("quic")


def test_a_datagram_fits_the_paths_mtu():
    with open("/sys/class/net/lo/mtu") as f:
        loopback = int(f.read())
    size = datagram_size(("127.0.0.1", 9), socket.AF_INET)
    assert 1200 <= size <= loopback - 28 and size == min(SEALABLE, loopback - 28)
    assert sealable() == SEALABLE >= 1452


def test_quic_without_aioquic_is_one_line_naming_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "aioquic.quic.connection", None)  # import fails
    with pytest.raises(ConfigError) as err:
        transports.load("quic")
    assert "transport quic needs aioquic" in str(err.value)
    assert "rxelab[quic]" in str(err.value) and "python3-aioquic" in str(err.value)


def test_datagrams_go_in_gso_batches_of_one_address_and_size_the_last_maybe_shorter():
    a, b = ("10.0.0.1", 1), ("10.0.0.2", 1)
    sent = [(b"x" * 1000, a)] * 3 + [(b"y" * 400, a), (b"z" * 1000, a), (b"w" * 1000, b)]
    got = quic_config.batches(sent, gso=True)
    assert [(len(batch), size, to) for batch, size, to in got] == [(4, 1000, a), (1, 1000, a),
                                                                    (1, 1000, b)]
    assert b"".join(got[0][0]) == b"x" * 3000 + b"y" * 400
    assert [len(batch) for batch, _, _ in quic_config.batches(sent, gso=False)] == [1] * 6
    many = quic_config.batches([(b"x" * 1452, a)] * 100, gso=True)
    assert [len(batch) for batch, _, _ in many] == [44, 44, 12]  # 65000 bytes a send at most
