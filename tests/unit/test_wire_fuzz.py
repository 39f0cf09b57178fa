"""Property-based fuzzing of the out-of-band wire format: whatever bytes arrive, decoding
either yields a message that passed its schema or raises ProtocolError - never another
exception (a crash of rank 0) - and every valid message survives a round trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rxelab.control import framing
from rxelab.errors import ProtocolError

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20)
hex4 = st.text("0123456789abcdef", min_size=4, max_size=4)
gids = st.lists(hex4, min_size=8, max_size=8).map(":".join)
endpoint = st.fixed_dictionaries({"qpn": st.integers(0, (1 << 24) - 1),
                                  "psn": st.integers(0, (1 << 24) - 1), "gid": gids,
                                  "lid": st.integers(0, (1 << 16) - 1)})


def frame(body: bytes) -> bytes:
    return framing.HEADER.pack(framing.MAGIC, framing.VERSION, len(body)) + body


def decodes_or_refuses(data: bytes) -> None:
    try:
        message = framing.decode(data)
    except ProtocolError:
        return
    framing.validate(message)  # what came out passed its schema


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes(data):
    decodes_or_refuses(data)
    try:
        framing.split_frame(data)
    except ProtocolError:
        pass


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(json_values)
def test_arbitrary_json_bodies(value):
    decodes_or_refuses(frame(json.dumps(value).encode()))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(framing.SCHEMAS)), st.dictionaries(st.text(max_size=10), json_values,
                                                              max_size=6))
def test_messages_of_known_types_with_arbitrary_fields(kind, fields):
    decodes_or_refuses(frame(json.dumps({"type": kind, **fields}).encode()))


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1),
                                                     st.lists(endpoint, min_size=n, max_size=n))))
def test_valid_hellos_round_trip(args):
    world, rank, eps = args
    hello = {"type": "hello", "rank": rank, "world_size": world, "host": "h", "settings": {},
             "listen": 0, "generation": 0,
             "endpoints": {str(p): eps[p] for p in range(world) if p != rank}}
    assert framing.decode(framing.encode(hello)) == hello
