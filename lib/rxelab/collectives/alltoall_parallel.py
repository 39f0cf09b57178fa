"""Fully parallel all-to-all (the seed's first draft): every block posted at once, then all
arrivals awaited. Most bytes in flight, least waiting on any one peer."""

from __future__ import annotations

from rxelab.collectives.common import DATA, Call


def run(c: Call) -> None:
    lay = c.blocks
    peers = [p for p in range(c.size) if p != c.rank]
    for peer in peers:
        c.expect(peer, DATA, lay.recv_off[peer], lay.recv_len[peer])
    c.copy_own_block(lay.send_off[c.rank], lay.recv_off[c.rank], lay.send_len[c.rank])
    ops = [c.send_block(peer, DATA, lay.send_off[peer], lay.send_len[peer]) for peer in peers]
    for peer in peers:
        c.recv_block(peer, DATA, lay.recv_off[peer], lay.recv_len[peer])
    c.finish(ops)
