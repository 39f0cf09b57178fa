"""RC's rules over a byte stream (rxelab.transports.wire), without sockets: two Wires joined
by pumping one's out() into the other's feed(), in pieces as small as one byte."""

from __future__ import annotations

import random

import numpy as np
import pytest
from rxelab.errors import ProtocolError
from rxelab.transports import base, wire

SLOTS, SLOT = 4, 64


class Memory:
    """One side's registrations: key -> (address, length, access), and its receive slots."""

    def __init__(self) -> None:
        self.keys: dict[int, tuple[int, int, int]] = {}
        self.held: list[np.ndarray] = []
        self.slots = self.buffer(SLOTS * SLOT, base.ACCESS_LOCAL_WRITE)[0]

    def buffer(self, n: int, access: int = base.ACCESS_REMOTE) -> tuple[np.ndarray, int]:
        b = np.zeros(n, dtype=np.uint8)
        self.held.append(b)
        key = len(self.keys) + 1
        self.keys[key] = (b.ctypes.data, n, access)
        return b, key

    def covers(self, key: int, addr: int, n: int, access: int) -> bool:
        at, length, allowed = self.keys.get(key, (0, 0, 0))
        return at <= addr and addr + n <= at + length and allowed & access == access


def pair() -> tuple[wire.Wire, Memory, wire.Wire, Memory]:
    ma, mb = Memory(), Memory()
    a = wire.Wire(1, SLOTS, SLOT, ma.slots.ctypes.data, ma.covers)
    b = wire.Wire(0, SLOTS, SLOT, mb.slots.ctypes.data, mb.covers)
    return a, ma, b, mb


def pump(a: wire.Wire, b: wire.Wire, piece: int = 1 << 20, rounds: int = 50) -> None:
    """Move bytes both ways until neither side has anything to say."""
    for _ in range(rounds):
        moved = False
        for src, dst in ((a, b), (b, a)):
            data = flat(src.out())
            for i in range(0, len(data), piece):
                dst.feed(data[i:i + piece])
            moved = moved or bool(data)
        if not moved:
            return
    raise AssertionError("the wires kept talking")


def flat(frames: list[wire.Frame]) -> bytes:
    return b"".join(bytes(p) for f in frames for p in f)


def statuses(done: list[wire.Completion]) -> list[tuple[int, int]]:
    return [(c.wr_id, c.status) for c in done]


@pytest.mark.parametrize("piece", [1, 7, 1 << 20])
def test_a_write_lands_in_place_and_only_its_signaled_request_completes(piece):
    a, ma, b, mb = pair()
    src, lkey = ma.buffer(1000)
    src[:] = np.arange(1000) % 251
    dst, rkey = mb.buffer(1000)
    a.post(11, base.WR_RDMA_WRITE, src.ctypes.data, 600, lkey, dst.ctypes.data, rkey, signaled=False)
    a.post(12, base.WR_RDMA_WRITE_WITH_IMM, src.ctypes.data + 600, 400, lkey,
           dst.ctypes.data + 600, rkey, imm=0xABCD)
    pump(a, b, piece)
    assert np.array_equal(dst, src)
    assert statuses(a.take()) == [(12, base.WC_SUCCESS)]  # none of its own for the unsignaled 11
    got = b.take()
    assert [(c.wr_id, c.opcode, c.imm_data, c.byte_len, c.wc_flags) for c in got] == \
        [((0 << 32) | 0, base.WC_RECV_RDMA_WITH_IMM, 0xABCD, 400, base.WC_WITH_IMM)]


def test_sends_fill_slots_in_order_with_their_lengths_and_immediates():
    a, ma, b, mb = pair()
    src, lkey = ma.buffer(SLOT)
    src[:5] = list(b"hello")
    a.post(1, base.WR_SEND, src.ctypes.data, 5, lkey)
    a.post(2, base.WR_SEND_WITH_IMM, src.ctypes.data, 3, lkey, imm=7)
    pump(a, b, 3)
    assert bytes(mb.slots[:5]) == b"hello" and bytes(mb.slots[SLOT:SLOT + 3]) == b"hel"
    got = b.take()
    assert [(c.wr_id, c.opcode, c.byte_len, c.imm_data, c.wc_flags) for c in got] == [
        (0, base.WC_RECV, 5, 0, 0), (1, base.WC_RECV, 3, 7, base.WC_WITH_IMM)]
    assert statuses(a.take()) == [(1, 0), (2, 0)]


def test_a_sender_without_credits_holds_the_head_and_everything_behind_it():
    a, ma, b, mb = pair()
    src, lkey = ma.buffer(SLOT)
    dst, rkey = mb.buffer(SLOT)
    for i in range(SLOTS + 1):
        a.post(i, base.WR_SEND, src.ctypes.data, 1, lkey)
    a.post(99, base.WR_RDMA_WRITE, src.ctypes.data, 8, lkey, dst.ctypes.data, rkey)  # no slot
    pump(a, b)
    assert [c.wr_id for c in b.take()] == [0, 1, 2, 3]  # slots 0..3, the fifth send waits
    assert [c.wr_id for c in a.take()] == [0, 1, 2, 3]
    assert len(a.queued) == 2 and a.queued[0].wr_id == SLOTS and a.queued[1].wr_id == 99
    b.repost(2)  # the engine consumed slot 2: a credit goes back in the next ACK
    pump(a, b)
    assert [c.wr_id for c in b.take()] == [2]  # the fifth send took slot 2
    assert [c.wr_id for c in a.take()] == [SLOTS, 99]


def test_a_zero_length_write_needs_no_key_and_is_acknowledged():
    a, _, b, _ = pair()
    a.post(5, base.WR_RDMA_WRITE, 0, 0, 0)
    pump(a, b)
    assert statuses(a.take()) == [(5, base.WC_SUCCESS)] and b.take() == []


@pytest.mark.parametrize("why", ["unknown key", "outside", "read-only"])
def test_a_write_outside_a_remote_writable_registration_fails_both_sides(why):
    a, ma, b, mb = pair()
    src, lkey = ma.buffer(64)
    src[:] = 9
    dst, rkey = mb.buffer(64, base.ACCESS_LOCAL_WRITE if why == "read-only" else base.ACCESS_REMOTE)
    key, at = {"unknown key": (rkey + 5, dst.ctypes.data), "outside": (rkey, dst.ctypes.data + 1),
               "read-only": (rkey, dst.ctypes.data)}[why]
    a.post(1, base.WR_SEND, src.ctypes.data, 4, lkey, signaled=False)
    a.post(2, base.WR_RDMA_WRITE, src.ctypes.data, 64, lkey, at, key, signaled=False)
    a.post(3, base.WR_SEND, src.ctypes.data, 4, lkey)
    pump(a, b, 5)
    assert not dst.any()  # nothing landed
    assert statuses(a.take())[:2] == [(2, base.WC_REM_ACCESS_ERR), (3, base.WC_WR_FLUSH_ERR)]
    got = statuses(b.take())
    assert got[0] == (0, base.WC_SUCCESS)  # the send before it was placed
    assert {s for _, s in got[1:]} == {base.WC_WR_FLUSH_ERR} and len(got) == SLOTS
    a.post(4, base.WR_SEND, src.ctypes.data, 4, lkey)  # after the error: flushed at once
    assert statuses(a.take()) == [(4, base.WC_WR_FLUSH_ERR)]


def test_a_send_longer_than_a_slot_fails_the_slot_and_the_sender():
    a, ma, b, _ = pair()
    src, lkey = ma.buffer(SLOT + 1)
    a.post(1, base.WR_SEND, src.ctypes.data, SLOT + 1, lkey)
    pump(a, b)
    assert statuses(a.take())[0] == (1, base.WC_REM_INV_REQ_ERR)
    assert statuses(b.take())[0] == (0, base.WC_LOC_LEN_ERR)


def test_a_local_key_that_does_not_cover_the_memory_fails_at_the_post():
    a, ma, _, _ = pair()
    src, lkey = ma.buffer(8)
    a.post(1, base.WR_SEND, src.ctypes.data, 9, lkey)
    assert statuses(a.take())[0] == (1, base.WC_LOC_PROT_ERR) and a.error is not None


def test_a_stream_that_ends_fails_what_is_outstanding_unless_the_peer_said_goodbye():
    a, ma, b, _ = pair()
    src, lkey = ma.buffer(8)
    a.post(1, base.WR_SEND, src.ctypes.data, 8, lkey)
    a.out()  # sent, never acknowledged
    a.lost()
    assert statuses(a.take()) == [(1, base.WC_RETRY_EXC_ERR)] + \
        [((1 << 32) | s, base.WC_WR_FLUSH_ERR) for s in range(SLOTS)]
    a, _, b, _ = pair()
    a.feed(b.bye())
    a.lost()
    assert a.take() == [] and a.error is None
    a, _, _, _ = pair()
    a.lost()  # nothing outstanding, no goodbye: the peer died; its receives flush
    assert a.error == base.WC_RETRY_EXC_ERR and len(a.take()) == SLOTS


def test_a_frame_out_of_sequence_or_of_an_unknown_kind_is_a_protocol_error():
    a, _, _, _ = pair()
    with pytest.raises(ProtocolError, match="expected frame 1"):
        a.feed(wire.HEADER.pack(wire.WRITE, 0, 0, 0, 0, 0, 0, 2))
    a, _, _, _ = pair()
    with pytest.raises(ProtocolError, match="kind 9"):
        a.feed(wire.HEADER.pack(9, 0, 0, 0, 0, 0, 0, 1))
    a, _, _, _ = pair()
    with pytest.raises(ProtocolError, match="never sent"):
        a.feed(wire.HEADER.pack(wire.ACK, 0, 0, 0, 0, 0, 0, 1))


def test_a_peer_that_sends_past_its_credits_is_a_protocol_error():
    _, _, b, _ = pair()
    frames = b"".join(wire.HEADER.pack(wire.SEND, 0, 0, 0, 0, 0, 0, s) for s in range(1, SLOTS + 2))
    with pytest.raises(ProtocolError, match="past the receive slots"):
        b.feed(frames)


def test_random_traffic_arrives_whole_in_order_in_any_pieces():
    rng = random.Random(58)
    for trial in range(30):
        a, ma, b, mb = pair()
        src, lkey = ma.buffer(4096)
        src[:] = np.frombuffer(rng.randbytes(4096), dtype=np.uint8)
        dst, rkey = mb.buffer(4096)
        want = np.zeros_like(dst)
        posted = signaled = 0
        for _ in range(rng.randrange(1, 40)):
            off, n = rng.randrange(4096), rng.randrange(0, 200)
            n = min(n, 4096 - off)
            sig = rng.random() < 0.3
            a.post(posted, base.WR_RDMA_WRITE, src.ctypes.data + off, n, lkey,
                   dst.ctypes.data + off, rkey, signaled=sig)
            want[off:off + n] = src[off:off + n]
            posted, signaled = posted + 1, signaled + sig
        a.post(posted, base.WR_RDMA_WRITE, 0, 0, 0)  # the flush: signaled
        pump(a, b, rng.choice([1, 2, 5, 31, 4096]))
        assert np.array_equal(dst, want), trial
        assert [c.status for c in a.take()] == [0] * (signaled + 1)


def test_garbage_is_a_protocol_error_or_waits_for_more_never_anything_else():
    rng = random.Random(59)
    for _ in range(300):
        _, _, b, _ = pair()
        data = rng.randbytes(rng.randrange(1, 200))
        if rng.random() < 0.5:  # a plausible header first, then noise
            data = wire.HEADER.pack(rng.randrange(1, 8), rng.randrange(2), 0, 0, 0,
                                    rng.randrange(64), 0, 1) + data
        try:
            b.feed(data)
        except ProtocolError:
            pass


def test_a_key_dropped_while_its_write_arrives_stops_the_rest_landing():
    a, ma, b, mb = pair()
    src, lkey = ma.buffer(1000)
    src[:] = 7
    dst, rkey = mb.buffer(1000)
    a.post(1, base.WR_RDMA_WRITE, src.ctypes.data, 1000, lkey, dst.ctypes.data, rkey)
    frames = flat(a.out())
    b.feed(frames[:wire.HEADER.size + 300])  # the header and 300 bytes landed
    del mb.keys[rkey]  # revoked (the guard of a failed communicator)
    b.feed(frames[wire.HEADER.size + 300:])
    assert dst[:300].all() and not dst[300:].any()
    pump(a, b)
    assert statuses(a.take())[0] == (1, base.WC_REM_ACCESS_ERR) and b.error is not None


def test_after_the_peers_goodbye_and_hang_up_a_post_fails_at_once():
    a, ma, b, _ = pair()
    src, lkey = ma.buffer(8)
    a.feed(b.bye())
    a.lost()
    assert a.error is None  # nothing was outstanding: no failure
    a.post(1, base.WR_SEND, src.ctypes.data, 8, lkey)
    assert statuses(a.take())[0] == (1, base.WC_RETRY_EXC_ERR) and a.error is not None


def test_an_error_stops_placing_the_frame_that_is_arriving():
    a, ma, b, mb = pair()
    src, lkey = ma.buffer(1000)
    src[:] = 3
    dst, rkey = mb.buffer(1000)
    a.post(1, base.WR_RDMA_WRITE, src.ctypes.data, 1000, lkey, dst.ctypes.data, rkey)
    frames = flat(a.out())
    b.feed(frames[:wire.HEADER.size + 100])
    b.fail()  # b's transport broke (or a peer's NAK put it in error)
    b.feed(frames[wire.HEADER.size + 100:])
    assert dst[:100].all() and not dst[100:].any()
