"""SSH host keys (issue 15, item 5): Fabric used to accept any host key when an inventory named
no known_hosts. Now an unknown key is refused unless the user accepts new ones, a changed key
is always refused, and accepting adds a line to known_hosts without rewriting it. Against a real
SSH server (paramiko's) on 127.0.0.1."""

from __future__ import annotations

import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from experiments.running import deploy, fleet
from infra.inventory import Host, RdmaEndpoint, SSHEndpoint
from infra.ssh import ssh_argv


class NoEntry(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "password"

    def check_auth_password(self, username: str, password: str) -> int:
        return paramiko.common.AUTH_FAILED


def host_key(tmp_path: Path, name: str) -> paramiko.PKey:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


@pytest.fixture
def server(tmp_path) -> Iterator[dict]:
    """An SSH server that shows state["key"] and lets nobody in."""
    listener = socket.create_server(("127.0.0.1", 0))
    state = {"key": host_key(tmp_path, "a"), "port": listener.getsockname()[1], "stop": False}

    def serve() -> None:
        listener.settimeout(0.2)
        while not state["stop"]:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            t = paramiko.Transport(conn)
            t.add_server_key(state["key"])
            try:
                t.start_server(server=NoEntry())
            except (paramiko.SSHException, EOFError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield state
    state["stop"] = True
    thread.join(5)
    listener.close()


def connect_once(host: Host) -> None:
    c = fleet.connect(host)
    try:
        c.open()
    finally:
        c.close()


def test_an_unknown_host_key_is_refused_by_default(server, tmp_path, monkeypatch):
    monkeypatch.delenv("RXELAB_ACCEPT_NEW_HOST_KEYS", raising=False)
    known = tmp_path / "known_hosts"
    known.write_text("")
    host = Host("far", SSHEndpoint("127.0.0.1", server["port"], "me", None, str(known)), "10.0.0.1",
                RdmaEndpoint())
    with pytest.raises(paramiko.SSHException, match="is not in .*RXELAB_ACCEPT_NEW_HOST_KEYS=1"):
        connect_once(host)
    check = deploy.deploy_one(host, b"", "0" * 64)
    assert "is not in" in check.problems[0] and known.read_text() == ""


def test_without_a_known_hosts_in_the_inventory_the_users_own_is_used(server, tmp_path, monkeypatch):
    monkeypatch.delenv("RXELAB_ACCEPT_NEW_HOST_KEYS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    host = Host("far", SSHEndpoint("127.0.0.1", server["port"], "me"), "10.0.0.1", RdmaEndpoint())
    with pytest.raises(paramiko.SSHException, match="is not in"):
        connect_once(host)


def test_accept_new_remembers_a_first_key_and_still_refuses_a_changed_one(server, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("RXELAB_ACCEPT_NEW_HOST_KEYS", "1")
    known = tmp_path / "known_hosts"
    ca_key = host_key(tmp_path, "ca")
    ca = f"@cert-authority *.corp {ca_key.get_name()} {ca_key.get_base64()}"
    known.write_text(f"# my hosts\n{ca}\n")
    host = Host("far", SSHEndpoint("127.0.0.1", server["port"], "me", str(tmp_path / "a"), str(known)),
                "10.0.0.1", RdmaEndpoint())
    with pytest.raises(paramiko.AuthenticationException):  # past the host key: it was accepted
        connect_once(host)
    lines = known.read_text().splitlines()
    assert lines[:2] == ["# my hosts", ca], "the user's lines stay as they were"
    assert lines[2].startswith(f"[127.0.0.1]:{server['port']} ssh-ed25519 ")
    with pytest.raises(paramiko.AuthenticationException):
        connect_once(host)
    assert len(known.read_text().splitlines()) == 3, "a known key is not added twice"
    server["key"] = host_key(tmp_path, "b")  # the host now shows another key
    with pytest.raises(paramiko.BadHostKeyException):
        connect_once(host)
    assert "changed" in deploy.deploy_one(host, b"", "0" * 64).problems[0].lower()


def test_ssh_command_lines_refuse_unknown_keys_unless_told(monkeypatch, tmp_path):
    host = Host("far", SSHEndpoint("h.example", 22, "me"), "10.0.0.1", RdmaEndpoint())
    monkeypatch.delenv("RXELAB_ACCEPT_NEW_HOST_KEYS", raising=False)
    assert "StrictHostKeyChecking=yes" in ssh_argv(host, "true")
    monkeypatch.setenv("RXELAB_ACCEPT_NEW_HOST_KEYS", "1")
    argv = ssh_argv(host, "true")
    assert "StrictHostKeyChecking=accept-new" in argv
    assert argv[argv.index("-l"):argv.index("-l") + 4] == ["-l", "me", "h.example", "--"]


def test_accepted_keys_file_is_private(server, tmp_path, monkeypatch):
    """No known_hosts anywhere yet: the user's ~/.ssh/known_hosts is made, 0600."""
    monkeypatch.setenv("RXELAB_ACCEPT_NEW_HOST_KEYS", "1")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    host = Host("far", SSHEndpoint("127.0.0.1", server["port"], "me", str(tmp_path / "a")),
                "10.0.0.1", RdmaEndpoint())
    with pytest.raises(paramiko.AuthenticationException):
        connect_once(host)
    made = tmp_path / "home" / ".ssh" / "known_hosts"
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert stat.S_IMODE(made.parent.stat().st_mode) == 0o700


def test_lines_of_a_known_hosts_that_paramiko_cannot_read_are_skipped_as_ssh_does(server, tmp_path,
                                                                                 monkeypatch):
    """paramiko alone gives up on the whole file at a @cert-authority line or a broken one."""
    monkeypatch.delenv("RXELAB_ACCEPT_NEW_HOST_KEYS", raising=False)
    key = server["key"]
    hashed = paramiko.HostKeys.hash_host(f"[127.0.0.1]:{server['port']}")
    known = tmp_path / "known_hosts"
    line = f"{hashed} {key.get_name()} {key.get_base64()}\n"
    known.write_text("h ssh-ed25519 AAAAnot-base64\n@cert-authority * ssh-ed25519 AAAAx\n" + line)
    host = Host("far", SSHEndpoint("127.0.0.1", server["port"], "me", str(tmp_path / "a"), str(known)),
                "10.0.0.1", RdmaEndpoint())
    with pytest.raises(paramiko.AuthenticationException):  # the hashed line vouched for the host
        connect_once(host)
    known.write_text(f"@revoked * {key.get_name()} {key.get_base64()}\n" + line)
    with pytest.raises(paramiko.SSHException, match="is not in"):
        connect_once(host)
    monkeypatch.setenv("RXELAB_ACCEPT_NEW_HOST_KEYS", "1")
    with pytest.raises(paramiko.SSHException, match="is revoked"):
        connect_once(host)


@pytest.mark.slow
def test_a_bad_accept_new_setting_is_one_error_before_any_connection(tmp_path):
    import json
    import os
    import sys

    from infra.config import REPO

    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"version": 1, "nodes": [
        {"name": "a", "ssh": {"host": "127.0.0.1", "port": 1}, "data_ip": "10.0.0.1"}]}))
    r = subprocess.run([sys.executable, "-m", "fabric", "deploy", "--inventory", str(inv)], cwd=REPO,
                       env={**os.environ, "RXELAB_ACCEPT_NEW_HOST_KEYS": "yes"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "RXELAB_ACCEPT_NEW_HOST_KEYS='yes'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
