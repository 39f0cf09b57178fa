"""A control-plane server's close() wakes its serving thread (issue 57): before, close() waited
out the thread's select (0.2 s), and every job's end paid it, which set the time of about 900
host tests of fake jobs (0.23 s per job of three ranks before, 0.03 s after)."""

from __future__ import annotations

import secrets

from rxelab.control import addresses, server
from rxelab.control.handshake import SharedSecret
from rxelab.control.liveness import Verdict, probe
from rxelab.control.server import Server


def test_close_ends_the_serving_thread_without_waiting_out_its_select(monkeypatch):
    monkeypatch.setattr(server, "HEAR_S", 30.0)  # were close() to wait, it would give up first
    cred = SharedSecret.of(secrets.token_urlsafe(32), "test")
    s = Server(addresses.any_address(0), cred, {"job"}, rank=0, generation=0)
    thread = s._thread
    # answered by the serving thread: it is in its loop, and back in its 30 s wait after this
    assert probe(("127.0.0.1", s.port), cred, scope="job", rank=1, to=0, generation=0) \
        == Verdict.ALIVE
    s.close(listener=True)
    assert not thread.is_alive(), "close() returned while its server still served"
    assert s.listener.fileno() < 0
