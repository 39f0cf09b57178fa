"""The TCP control plane: rank 0 collects every rank's QP endpoints and hands each rank the
endpoints it must connect to; later it serves barriers. The connections stay open for the
life of the communicator, so a rank that dies is noticed (its socket closes).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from rxelab import wire
from rxelab.bootstrap import JobInfo
from rxelab.errors import PeerError, ProtocolError


class ControlPlane:
    def __init__(self, job: JobInfo, timeout: float) -> None:
        self.job = job
        self.timeout = timeout
        self.peers: dict[int, socket.socket] = {}  # rank 0: every other rank
        self.root: socket.socket | None = None  # other ranks: rank 0
        self.barrier_seq = 0

    def exchange(self, endpoints: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """Give our endpoint for each peer; get each peer's endpoint for us."""
        if self.job.world_size == 1:
            return {}
        if self.job.rank == 0:
            return self._serve(endpoints)
        return self._join(endpoints)

    def _serve(self, mine: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        job = self.job
        deadline = time.monotonic() + self.timeout
        listener = socket.create_server(("", job.master_port), reuse_port=False)
        hellos: dict[int, dict[str, Any]] = {0: {"endpoints": {str(k): v for k, v in mine.items()}}}
        try:
            while len(hellos) < job.world_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(job.world_size)) - set(hellos))
                    raise PeerError(f"ranks {missing} did not join within {self.timeout:g} s",
                                    peer=missing[0],
                                    hint=f"are they started, with MASTER_ADDR={job.master_addr} "
                                         f"and MASTER_PORT={job.master_port}?")
                listener.settimeout(remaining)
                try:
                    sock, addr = listener.accept()
                except TimeoutError:
                    continue
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello = wire.recv(sock, deadline=deadline, peer=f"a joining rank at {addr[0]}",
                                  expect="hello")
                r = hello["rank"]
                if hello["world_size"] != job.world_size:
                    raise ProtocolError(f"rank {r} thinks the world has {hello['world_size']} "
                                        f"ranks, rank 0 thinks {job.world_size}")
                if r in hellos or r == 0:
                    raise ProtocolError(f"two processes claim rank {r}")
                expected = {str(p) for p in range(job.world_size) if p != r}
                if set(hello["endpoints"]) != expected:
                    raise ProtocolError(f"rank {r} sent endpoints for {sorted(hello['endpoints'])}")
                hellos[r] = hello
                self.peers[r] = sock
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()
        for r, sock in self.peers.items():
            table = {str(p): hellos[p]["endpoints"][str(r)] for p in hellos if p != r}
            wire.send(sock, {"type": "table", "endpoints": table})
        return {p: hellos[p]["endpoints"]["0"] for p in hellos if p != 0}

    def _join(self, mine: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        job = self.job
        deadline = time.monotonic() + self.timeout
        last_error: OSError | None = None
        while self.root is None:
            try:
                self.root = socket.create_connection((job.master_addr, job.master_port), timeout=5)
            except OSError as err:  # rank 0 may not be listening yet
                last_error = err
                if time.monotonic() > deadline:
                    raise PeerError(f"cannot reach rank 0 at {job.master_addr}:{job.master_port} "
                                    f"within {self.timeout:g} s: {last_error}", peer=0) from None
                time.sleep(0.2)
        self.root.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wire.send(self.root, {"type": "hello", "rank": job.rank, "world_size": job.world_size,
                              "host": socket.gethostname()[:200] or "?",
                              "endpoints": {str(k): v for k, v in mine.items()}})
        table = wire.recv(self.root, deadline=deadline, peer="rank 0", expect="table")
        got = {int(k): v for k, v in table["endpoints"].items()}
        if set(got) != set(range(job.world_size)) - {job.rank}:
            raise ProtocolError(f"rank 0 sent endpoints for ranks {sorted(got)}")
        return got

    def barrier(self) -> None:
        if self.job.world_size == 1:
            return
        self.barrier_seq += 1
        seq = self.barrier_seq
        deadline = time.monotonic() + self.timeout
        if self.job.rank == 0:
            for r, sock in sorted(self.peers.items()):
                msg = wire.recv(sock, deadline=deadline, peer=f"rank {r}", expect="barrier")
                if msg["seq"] != seq or msg["rank"] != r:
                    raise ProtocolError(f"rank {r} is at barrier {msg['seq']}, rank 0 at {seq}")
            for sock in self.peers.values():
                wire.send(sock, {"type": "release", "seq": seq})
        else:
            assert self.root is not None
            try:
                wire.send(self.root, {"type": "barrier", "rank": self.job.rank, "seq": seq})
            except OSError as err:
                raise PeerError(f"rank 0 is gone: {err}", peer=0) from None
            msg = wire.recv(self.root, deadline=deadline, peer="rank 0", expect="release")
            if msg["seq"] != seq:
                raise ProtocolError(f"rank 0 released barrier {msg['seq']}, this rank is at {seq}")

    def close(self) -> None:
        for sock in [*self.peers.values(), *([self.root] if self.root else [])]:
            try:
                sock.close()
            except OSError:
                pass
        self.peers.clear()
        self.root = None
