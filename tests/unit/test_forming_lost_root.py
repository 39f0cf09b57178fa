"""A rank whose rank 0 closed its connection between the dial and the hello: the write fails
with the kernel's error (EPIPE once the reset came back), and the rank must hear a PeerError
saying rank 0 is gone, as a read that finds the connection closed says. A raw OSError escaped
the shrink's "agree again" (it waits for PeerError) and ended a survivor with a traceback."""

from __future__ import annotations

import errno

import pytest
from rxelab.control import rendezvous
from rxelab.errors import PeerError, Reason


class ClosedLink:
    def __init__(self, error: OSError) -> None:
        self.error, self.closed = error, False

    def send(self, message: dict) -> None:
        raise self.error

    def recv(self, **kwargs: object) -> dict:  # pragma: no cover - send fails first
        raise AssertionError("no reply is read after a failed hello")

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("error", [BrokenPipeError(errno.EPIPE, "Broken pipe"),
                                   ConnectionResetError(errno.ECONNRESET, "reset by peer")])
def test_a_hello_rank_0_cannot_take_is_rank_0_gone(error: OSError) -> None:
    link = ClosedLink(error)
    with pytest.raises(PeerError) as err:
        rendezvous._hello(None, link, {"type": "hello"}, deadline=0.0)  # type: ignore[arg-type]
    assert err.value.peer == 0 and err.value.reason == Reason.DIED and link.closed
    assert "connection to rank 0 failed" in str(err.value)
