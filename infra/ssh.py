"""SSH to a host of the inventory with plain OpenSSH: the same command a user would type."""

from __future__ import annotations

import shlex

from infra import run as runner
from infra.inventory import Host


def shell_vars(**values: object) -> str:
    """`name='value'; ...`: how an inventory's values reach a remote shell - quoted, once, so
    the commands after it only ever say "$name"."""
    return "".join(f"{k}={shlex.quote(str(v))}; " for k, v in values.items())


def ssh_argv(host: Host, *command: str, connect_timeout: int = 10, tty: bool = False) -> list[str]:
    argv = ["ssh", "-p", str(host.ssh.port), "-o", f"ConnectTimeout={connect_timeout}",
            "-o", "LogLevel=ERROR"]
    if host.ssh.key:
        argv += ["-i", host.ssh.key, "-o", "IdentitiesOnly=yes"]
    if host.ssh.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={host.ssh.known_hosts}",
                 "-o", "StrictHostKeyChecking=yes"]
    argv += ["-t"] if tty else ["-o", "BatchMode=yes"]
    argv.append(f"{host.ssh.user}@{host.ssh.host}")
    if command:
        argv += ["--", *command]
    return argv


def ssh_run(host: Host, command: str, *, timeout: float = 60, check: bool = True) -> runner.Result:
    return runner.run(ssh_argv(host, command), timeout=timeout, check=check)
