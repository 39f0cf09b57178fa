"""The out-of-band message format rejects everything that is not exactly right."""

import json
import socket
import struct
import time

import pytest
from rxelab.control import framing, handshake
from rxelab.errors import PeerError, ProtocolError

GID = "0000:0000:0000:0000:0000:ffff:0a0a:000b"
EP = {"qpn": 17, "psn": 123456, "gid": GID, "lid": 0}


def hello(**over):
    msg = {"type": "hello", "rank": 1, "world_size": 3, "host": "node2", "settings": {},
           "listen": 0, "generation": 0, "endpoints": {"0": EP, "2": EP}}
    msg.update(over)
    return msg


def test_round_trip():
    assert framing.decode(framing.encode(hello())) == hello()
    table = {"type": "table", "endpoints": {"0": EP, "2": EP}, "directory": {}, "job": "0f" * 16}
    assert framing.decode(framing.encode(table)) == table
    elastic = {**table, "directory": {"0": ["node1", 29500], "2": ["10.10.0.13", 40001]}}
    assert framing.decode(framing.encode(elastic)) == elastic


def frame(body: bytes, version=framing.VERSION, magic=framing.MAGIC, length=None):
    return framing.HEADER.pack(magic, version, len(body) if length is None else length) + body


@pytest.mark.parametrize(
    "data, problem",
    [
        (b"RXL", "truncated message"),
        (frame(b'{"type": "bye", "rank": 1}')[:-3], "truncated message: header says"),
        (frame(b'{"type": "bye", "rank": 1}', version=1), "message version 1"),
        (frame(b'{"type": "bye", "rank": 1}', magic=b"HTTP"), "not an rxelab message"),
        (frame(b"", length=framing.MAX_BODY + handshake.TAG_BYTES + 1), "exceeds the limit"),
        (frame(b"\x80\x81"), "not JSON"),
        (frame(b"[1, 2]"), "not an object"),
        (frame(b'{"type": "gossip"}'), "unknown message type"),
        (frame(b'{"type": "bye"}'), "lacks 'rank'"),
        (frame(b'{"type": "bye", "rank": "1"}'), "bad 'rank'"),
        (frame(b'{"type": "bye", "rank": true}'), "bad 'rank'"),
        (frame(b'{"type": "bye", "rank": 1, "extra": 0}'), "unknown fields"),
        (frame(b"[" * 100000 + b"]" * 100000), "nested too deeply"),
        (frame(b'{"type": "bye", "rank": ' + b"9" * 5000 + b"}"), "impossible value"),
        (frame(json.dumps(hello(endpoints={"0": {}, "2": EP})).encode()), "endpoint 0 must have"),
        (frame(json.dumps(hello(endpoints={"0": {**EP, "gid": "zzzz" + GID[4:]}, "2": EP}))
               .encode()), "bad 'gid'"),
        (frame(json.dumps(hello(token="ab" * 32)).encode()), "unknown fields"),
        (frame(json.dumps(hello(endpoints={"0": {"2": EP}, "2": EP})).encode()), "endpoint 0 must have"),
        (frame(json.dumps(hello(endpoints={"12345678901": EP})).encode()), "is not a rank"),
    ],
)
def test_bad_frames_are_protocol_errors(data, problem):
    with pytest.raises(ProtocolError, match=problem):
        framing.decode(data)


@pytest.mark.parametrize(
    "endpoint, problem",
    [
        ({**EP, "qpn": 1 << 24}, "bad 'qpn'"),
        ({**EP, "psn": -1}, "bad 'psn'"),
        ({**EP, "gid": "::ffff:10.10.0.11"}, "bad 'gid'"),
        ({k: v for k, v in EP.items() if k != "lid"}, "must have"),
        ({**EP, "pickle": "cos\nsystem"}, "must have"),
        ({"host": "10.0.0.1", "port": 0}, "bad 'port'"),
        ({"host": "10.0.0.1", "port": True}, "bad 'port'"),
        ({"host": "a b", "port": 5}, "bad 'host'"),
        ({"host": "10.0.0.1", "port": 5, "qpn": 1}, "must have"),
        ({**EP, "host": "10.0.0.1", "port": 5}, "must have"),
    ],
)
def test_bad_endpoints_are_protocol_errors(endpoint, problem):
    with pytest.raises(ProtocolError, match=problem):
        framing.encode(hello(endpoints={"0": endpoint}))


def test_each_transports_endpoint_passes_alone():
    for ep in (EP, {"host": "node2.lab", "port": 40001}, {"host": "fe80::1%eth1", "port": 1}):
        assert framing.decode(framing.encode(hello(endpoints={"0": ep})))["endpoints"]["0"] == ep


def test_the_control_plane_does_not_serve_a_data_connection():
    from rxelab.control import addresses
    from rxelab.control.server import Server
    s = Server(addresses.any_address(0), handshake.OPEN, {"job"}, rank=0, generation=0)
    try:
        knock = {"kind": "hello", "rank": 1, "to": 0, "generation": 0, "scope": "job"}
        assert s._wanted(knock) is None
        assert "data connection" in str(s._wanted({**knock, "kind": "data"}))
    finally:
        s.close(listener=True)


def test_oversized_message_is_refused_before_sending():
    with pytest.raises(ProtocolError, match="exceeds"):
        framing.encode({"type": "abort", "rank": 0, "reason": "x" * (framing.MAX_BODY + 10),
                     "why": "failed"})


def pair():
    a, b = socket.socketpair()
    return a, b


def test_recv_over_a_socket_with_deadline():
    a, b = pair()
    with a, b:
        framing.send(a, hello())
        assert framing.recv(b, deadline=time.monotonic() + 5, peer="rank 1") == hello()
        started = time.monotonic()
        with pytest.raises(PeerError, match="rank 1 did not answer in time"):
            framing.recv(b, deadline=time.monotonic() + 0.3, peer="rank 1")
        assert time.monotonic() - started < 2


def test_recv_reports_a_peer_that_closed_mid_message():
    a, b = pair()
    with b:
        a.sendall(framing.encode(hello())[:20])
        a.close()
        with pytest.raises(PeerError, match="closed the connection mid-message"):
            framing.recv(b, deadline=time.monotonic() + 5, peer="rank 2")


def test_abort_from_a_peer_becomes_a_peer_error():
    a, b = pair()
    with a, b:
        framing.send(a, {"type": "abort", "rank": 2, "reason": "out of memory", "why": "died"})
        with pytest.raises(PeerError, match="rank 2 aborted: out of memory") as e:
            framing.recv(b, deadline=time.monotonic() + 5, peer="rank 2")
        assert e.value.peer == 2 and e.value.reason == "died", "the reason travels as it was found"


def test_an_abort_without_its_reason_or_with_an_unknown_one_is_refused():
    for message in ({"type": "abort", "rank": 2, "reason": "x"},
                    {"type": "abort", "rank": 2, "reason": "x", "why": "is gone"}):
        with pytest.raises(ProtocolError, match="why"):
            framing.encode(message)


def test_wrong_message_type_is_named():
    a, b = pair()
    with a, b:
        framing.send(a, {"type": "bye", "rank": 1})
        with pytest.raises(ProtocolError, match="expected a table message from rank 0, got bye"):
            framing.recv(b, deadline=time.monotonic() + 5, peer="rank 0", expect="table")


def test_header_is_network_byte_order():
    data = framing.encode({"type": "bye", "rank": 1})
    magic, version, length = struct.unpack("!4sHI", data[:10])
    assert (magic, version, length) == (b"RXLB", framing.VERSION, len(data) - 10)
    assert json.loads(data[10:]) == {"type": "bye", "rank": 1}


def test_frames_are_split_as_bytes_arrive_and_strangers_are_refused_at_once():
    data = framing.encode(hello()) + framing.encode({"type": "bye", "rank": 1})
    assert framing.split_frame(data[:5]) is None and framing.split_frame(data[:40]) is None
    message, used = framing.split_frame(data)
    assert message == hello() and framing.split_frame(data[used:])[0]["type"] == "bye"
    for stranger in (b"GET / HTTP/1.1\r\n", b"SSH-2.0-OpenSSH", b"R\x00"):
        with pytest.raises(ProtocolError, match="not an rxelab message"):
            framing.split_frame(stranger[:3])
