"""Where a job's ranks listen, and where they dial.

A job with a secret listens on every address of every family (IPv6 and IPv4 on one dual-stack
socket where the host has IPv6): whatever MASTER_ADDR resolves to on the other ranks, rank 0
holds it, so no local user can take a family it left free (`localhost` resolves to ::1 first)
and sit between the ranks; and a stranger that reaches it fails the handshake. The dialling
side tries each address a name resolves to until one proves itself.

A job without a secret (anyone can join it: the library says so) listens on MASTER_ADDR's
address only, as before.
"""

from __future__ import annotations

import errno
import logging
import socket

from rxelab.bootstrap import JobInfo
from rxelab.errors import ConfigError

log = logging.getLogger(__name__)
# an elastic rank's listener is read only by its server: room for the probes and knocks that
# come at once when the membership changes (the kernel caps it at net.core.somaxconn)
BACKLOG = 1024


def loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1") or \
        address.startswith("::ffff:127.")


def any_address(port: int) -> socket.socket:
    """A listener on every address of every family this host has, on `port` (0: any free)."""
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True,
                                        backlog=BACKLOG)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise
    return socket.create_server(("", port), family=socket.AF_INET, backlog=BACKLOG)


def listen(job: JobInfo) -> socket.socket:
    """Rank 0's rendezvous (see the module's docstring). A job without a secret listens only
    on MASTER_ADDR's address, preferring one that is not loopback (Debian maps a host's own
    name to 127.0.1.1 too); where MASTER_ADDR is a name that this host resolves to loopback
    only (other hosts resolve it by DNS), on every interface."""
    port = job.master_port
    if job.secured:
        try:
            return any_address(port)
        except OSError as err:
            raise _unable(job, err) from None
    try:
        infos = socket.getaddrinfo(job.master_addr, port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise ConfigError(f"MASTER_ADDR={job.master_addr} does not resolve: {err}") from None
    found = sorted({(str(info[4][0]), socket.AddressFamily(info[0])) for info in infos},
                   key=lambda a: (loopback(a[0]), a[0]))
    named_loopback = job.master_addr == "localhost" or loopback(job.master_addr)
    if all(loopback(a) for a, _ in found) and not named_loopback:
        found = [("", socket.AF_INET)]
    where = "every interface" if found[0][0] == "" else f"{found[0][0]}:{port} only"
    log.warning("rxelab: this job has no secret (RXELAB_JOB_TOKEN): rank 0 listens on %s, and "
                "any process that reaches it while the job starts can join; export "
                "RXELAB_JOB_TOKEN to every rank to keep strangers out", where)
    last: OSError | None = None
    for host, family in found:
        try:
            return socket.create_server((host, port), family=family, reuse_port=False,
                                        backlog=BACKLOG)
        except OSError as err:
            last = err
    assert last is not None
    raise _unable(job, last)


def _unable(job: JobInfo, err: OSError) -> ConfigError:
    if err.errno == errno.EADDRNOTAVAIL:
        return ConfigError(f"rank 0 cannot listen on MASTER_ADDR={job.master_addr}: not an "
                           "address of this host", hint="start rank 0 on the host MASTER_ADDR names")
    return ConfigError(f"rank 0 cannot listen on port {job.master_port}: {err.strerror or err}",
                       hint="another job (or torchrun's store) holds it: choose another "
                            "MASTER_PORT, or set RXELAB_MASTER_PORT")


def own(job: JobInfo) -> socket.socket:
    """An elastic rank's own listener, on any free port (every address: the others reach it
    where its connection to rank 0 came from, or at MASTER_ADDR beside rank 0)."""
    try:
        return any_address(0)
    except OSError as err:
        raise ConfigError(f"this rank cannot listen for the job's membership: {err}") from None


def addresses(host: str, port: int) -> list[tuple[str, int]]:
    """Every address `host` resolves to, in the resolver's order ([] if it does not)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    out: list[tuple[str, int]] = []
    for info in infos:
        addr = (str(info[4][0]), int(info[4][1]))
        if addr not in out:
            out.append(addr)
    return out
