"""SSH to a host of the inventory with plain OpenSSH: the same command a user would type."""

from __future__ import annotations

import shlex

from infra import lab_settings
from infra import run as runner
from infra.inventory import Host


def shell_vars(**values: object) -> str:
    """`name='value'; ...`: how an inventory's values reach a remote shell - quoted, once, so
    the commands after it only ever say "$name"."""
    return "".join(f"{k}={shlex.quote(str(v))}; " for k, v in values.items())


def accept_new_host_keys() -> bool:
    """RXELAB_ACCEPT_NEW_HOST_KEYS=1: a host seen for the first time is trusted (and its key
    remembered); otherwise only keys already in a known_hosts file are."""
    return bool(lab_settings.value("RXELAB_ACCEPT_NEW_HOST_KEYS"))


def ssh_argv(host: Host, *command: str, connect_timeout: int = 10, tty: bool = False) -> list[str]:
    """The inventory's values were validated (no leading '-', no spaces): none can become an
    option. Host keys are checked against the inventory's known_hosts, or the user's."""
    checking = "accept-new" if accept_new_host_keys() else "yes"
    argv = ["ssh", "-p", str(host.ssh.port), "-o", f"ConnectTimeout={connect_timeout}",
            "-o", "LogLevel=ERROR", "-o", f"StrictHostKeyChecking={checking}"]
    if host.ssh.key:
        argv += ["-i", host.ssh.key, "-o", "IdentitiesOnly=yes"]
    if host.ssh.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={host.ssh.known_hosts}"]
    argv += ["-t"] if tty else ["-o", "BatchMode=yes"]
    argv += ["-l", host.ssh.user, host.ssh.host]
    if command:
        argv += ["--", *command]
    return argv


def ssh_run(host: Host, command: str, *, timeout: float = 60, check: bool = True) -> runner.Result:
    return runner.run(ssh_argv(host, command), timeout=timeout, check=check)
