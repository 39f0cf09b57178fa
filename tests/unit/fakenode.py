"""A node that lets us in over SSH and then never answers: what a frozen guest or a hung
command looks like to the host. A real SSH server (paramiko's) on 127.0.0.1, with an inventory
that names it, its key and its host key, for tests of how every `fab` task ends when a node
stops answering."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import paramiko


class FrozenNode(paramiko.ServerInterface):
    """Takes any key of the user `lab`, opens sessions, accepts commands, runs none."""

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.common.AUTH_SUCCESSFUL if username == "lab" else paramiko.common.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.common.OPEN_SUCCEEDED if kind == "session" else \
            paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        return True  # and then nothing: no output, no exit status


@dataclass
class Served:
    inventory: Path
    transports: list[paramiko.Transport]


def _key(path: Path) -> paramiko.PKey:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


@contextmanager
def frozen_nodes(tmp_path: Path, count: int = 3) -> Iterator[Served]:
    """`count` inventory nodes, each a frozen SSH server of its own; stopped on exit."""
    host_key = _key(tmp_path / "host_key")
    _key(tmp_path / "user_key")
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    ports = [sock.getsockname()[1] for sock in listeners]
    (tmp_path / "known_hosts").write_text("".join(
        f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n" for port in ports))
    nodes = [{"name": f"frozen{i}", "data_ip": f"10.99.0.{i}",
              "ssh": {"host": "127.0.0.1", "port": port, "user": "lab",
                      "key": str(tmp_path / "user_key"), "known_hosts": str(tmp_path / "known_hosts")},
              "rdma": {"device": "rxe0", "port": 1, "gid_index": 1}}
             for i, port in enumerate(ports, start=1)]
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"version": 1, "lab": "frozen", "nodes": nodes}))
    served = Served(inventory, [])
    stop = threading.Event()

    def serve(listener: socket.socket) -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            t = paramiko.Transport(conn)
            t.add_server_key(host_key)
            served.transports.append(t)
            try:
                t.start_server(server=FrozenNode())
            except (paramiko.SSHException, EOFError):
                pass

    threads = [threading.Thread(target=serve, args=(sock,), daemon=True) for sock in listeners]
    for t in threads:
        t.start()
    try:
        yield served
    finally:
        stop.set()
        for t, sock in zip(threads, listeners, strict=True):
            t.join(5)
            sock.close()
        for transport in served.transports:
            transport.close()
