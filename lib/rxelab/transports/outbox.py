"""What a stream socket has yet to send of a connection's frames, kept whole frame by frame:
the part of the tcp transport that decides what may still go once the connection fails."""

from __future__ import annotations

import collections
import itertools
import socket

from rxelab.transports.wire import Frame


class Outbox:
    """The frames a socket has not taken yet. A frame begun goes out whole (the stream stays
    whole until the peer hears of an error); once the connection is in error the frames not
    begun are dropped, so no more of the application's memory is read for them."""

    def __init__(self) -> None:
        self.frames: collections.deque[list[memoryview]] = collections.deque()
        self.bytes = 0
        self.begun = False  # the first frame is partly sent

    def __bool__(self) -> bool:
        return bool(self.frames)

    def add(self, frames: list[Frame]) -> None:
        for frame in frames:
            views = [memoryview(p) for p in frame]
            self.frames.append(views)
            self.bytes += sum(len(v) for v in views)

    def cut(self) -> None:
        kept = [self.frames[0]] if self.begun and self.frames else []
        self.frames = collections.deque(kept)
        self.bytes = sum(len(v) for f in kept for v in f)

    def send(self, sock: socket.socket) -> None:
        """As much as the socket takes now (BlockingIOError: nothing)."""
        pieces = [v for f in itertools.islice(self.frames, 32) for v in f]
        self.taken(sock.sendmsg(pieces[:64]))

    def taken(self, n: int) -> None:
        self.bytes -= n
        while n:
            frame = self.frames[0]
            if n >= len(frame[0]):
                n -= len(frame.pop(0))
                self.begun = bool(frame)
                if not frame:
                    self.frames.popleft()
            else:
                frame[0] = frame[0][n:]
                self.begun, n = True, 0
