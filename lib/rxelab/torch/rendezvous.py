"""How the ranks of a torch process group meet: through the store torch hands the backend,
not a port of their own. Rank 0 listens on a free port of every address and publishes where
(its host, the port) in the store; the others read it there and dial, as under init().

The job's secret (rxelab.control.handshake: every control-plane connection proves it) comes from rxelab's
own sources (RXELAB_JOB_TOKEN, RXELAB_JOB_TOKEN_FILE, Open MPI's job key: rxelab.bootstrap)
where the ranks have one. Under srun without one, the ranks prove themselves with MUNGE, as
rxelab.init does there (rxelab.control.munge_credential), and nothing secret goes into the
store. Otherwise rank 0 draws a secret and puts it in the store, so the job is as closed as torch's store is
(whoever can reach the store reads it and can join, and could join Gloo's job as well); under
srun without munged, rank 0 says so.
The host rank 0 publishes is RXELAB_MASTER_ADDR, else MASTER_ADDR, else its host name.

What the store holds is read as untrusted input: checked before it is used.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from rxelab import bootstrap
from rxelab.control import addresses, munge_credential
from rxelab.control.handshake import Credential, SharedSecret
from rxelab.errors import ConfigError, PeerError, ProtocolError, Reason

log = logging.getLogger(__name__)
WHERE_KEY = "rxelab/rendezvous"  # inside torch's PrefixStore of the group: one per group
SECRET_KEY = "rxelab/secret"
FROM_STORE = "torch's store"
MUNGE = "MUNGE"  # what rank 0 publishes as its secret's source when the ranks use MUNGE
IN_STORE_UNDER_SRUN = (
    "rxelab: under srun without MUNGE (munged) or RXELAB_JOB_TOKEN, the job's secret is in torch's "
    "store: anyone who reaches the store (MASTER_ADDR:MASTER_PORT) can read it and join the job; "
    "run munged, or export RXELAB_JOB_TOKEN (rxelab-launch --new-token) to every rank")
SOURCE = "torch.distributed"
_HOST = re.compile(r"[A-Za-z0-9._:%-]{1,255}")


ENV_RENDEZVOUS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # torch's env://


def torch_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What torch's env:// lacks for a rank srun or mpirun started (torchrun and our launcher
    set it all): RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as rxelab's own discovery reads
    them (rxelab.bootstrap: the step's first node and a port drawn from the job and step ids
    under Slurm: the first of the step's candidates, where torch's own store listens, with no
    fallback of torch's if another process holds it), so init_process_group("rxelab") starts
    with nothing set by hand. Nothing where the launcher is none of those, or does not say
    enough."""
    if all(env.get(k) for k in ENV_RENDEZVOUS):
        return {}
    try:
        job = bootstrap.discover(env=env)
    except ConfigError:
        return {}
    if job.source not in ("Slurm", "Open MPI", "PMI"):
        return {}
    found = {"RANK": str(job.rank), "WORLD_SIZE": str(job.world_size),
             "MASTER_ADDR": job.master_addr, "MASTER_PORT": str(job.master_port)}
    return {k: v for k, v in found.items() if not env.get(k)}


def stores_without_libuv(modules: list[Any]) -> None:
    """Each module's TCPStore falls back to the server the torch has where it has no libuv
    (Debian 13's 2.6). torch >= 2.4 asks TCPStore for libuv by default: env:// (unless
    USE_LIBUV=0), and torchrun's rendezvous and its workers' clients whatever the environment
    says; such a torch then stops each of them at "use_libuv was requested but PyTorch was
    build without libuv support". The constructor says so before it opens anything, so the
    fallback costs nothing where libuv is there, and nothing is asked beforehand. Only the
    modules' own name is rebound: `dist.TCPStore` a program uses stays torch's (unless the
    program is torchrun itself, rxelab.torch.torchrun)."""
    for module in modules:
        made = getattr(module, "TCPStore", None)
        if made is None or getattr(made, "falls_back_without_libuv", False):
            continue
        module.TCPStore = _falling_back(made)


LIBUV_MISSING = "without libuv support"  # torch's words; a libuv store that failed otherwise stands
USE_LIBUV_AT = 8  # TCPStore's use_libuv when given by position (host, port, ..., master_listen_fd)


def _falling_back(made: Any) -> Any:
    def tcp_store(*args: Any, **kwargs: Any) -> Any:
        try:
            return made(*args, **kwargs)
        except RuntimeError as err:  # DistStoreError is one
            if LIBUV_MISSING not in str(err):
                raise
            if len(args) > USE_LIBUV_AT:
                if args[USE_LIBUV_AT] is False:
                    raise
                args = (*args[:USE_LIBUV_AT], False, *args[USE_LIBUV_AT + 1:])
            elif kwargs.get("use_libuv") is False:
                raise
            else:
                kwargs = {**kwargs, "use_libuv": False}
        return made(*args, **kwargs)

    tcp_store.falls_back_without_libuv = True  # type: ignore[attr-defined]
    return tcp_store


def where(env: Mapping[str, str], first_of_job: bool = True) -> str:
    """The host name or address the other ranks dial to reach this group's rank 0. The job's
    rank 0 is at MASTER_ADDR; a subgroup's rank 0 elsewhere gives the address this host
    reaches MASTER_ADDR from (a UDP socket's connect() picks it; nothing is sent)."""
    named = env.get("RXELAB_MASTER_ADDR") or env.get("MASTER_ADDR")
    if first_of_job or not named:
        return named or socket.gethostname()
    try:
        for family, kind, proto, _, addr in socket.getaddrinfo(named, 9, type=socket.SOCK_DGRAM):
            with socket.socket(family, kind, proto) as s:
                s.connect(addr)
                return str(s.getsockname()[0])
    except OSError:
        pass
    return socket.gethostname()


def meet(store: Any, rank: int, size: int, wait_s: float,
         env: Mapping[str, str] | None = None,
         first_of_job: bool = True) -> tuple[bootstrap.JobInfo, socket.socket | None]:
    """This rank's JobInfo, and on rank 0 of a job of several ranks its listener (which the
    communicator serves the job's hellos on). first_of_job: this group's rank 0 is the job's
    (the whole world, or a subgroup that holds global rank 0)."""
    env = os.environ if env is None else env
    if not (isinstance(rank, int) and isinstance(size, int) and 0 <= rank < size
            and size <= bootstrap.MAX_RANKS):
        raise ConfigError(f"rank {rank} of {size} is not a rank of a job rxelab can form")
    secret, source = bootstrap.job_secret(env)
    if size == 1:
        return bootstrap.JobInfo(0, 1, "127.0.0.1", 0, SOURCE,
                                 SharedSecret.of(secret or secrets.token_hex(32), source or "own"),
                                 launch_id=""), None
    mine: Credential | None = SharedSecret.of(secret, source) if secret else None
    if mine is None and env.get("SLURM_JOB_ID") and munge_credential.available():
        mine, source = munge_credential.MungeCredential(), MUNGE
    if rank == 0:
        return _publish(store, size, mine, source, where(env, first_of_job),
                        under_srun=bool(env.get("SLURM_JOB_ID")))
    info = _read(store, wait_s)
    if info["secret"] == FROM_STORE:
        if mine is not None:
            raise ConfigError(f"this rank has a job secret ({source}), rank 0 has none",
                              hint="give every rank the same RXELAB_JOB_TOKEN, or none")
        mine = SharedSecret.of(_text(_get(store, SECRET_KEY, "the job's secret"),
                                     "the job's secret", 256), FROM_STORE)
    elif info["secret"] == MUNGE:
        if not isinstance(mine, munge_credential.MungeCredential):
            raise ConfigError(f"rank 0 proves itself with MUNGE, this rank "
                              f"{'has a job secret (' + source + ')' if mine else 'has no munged'}",
                              hint="run munged on every node, or give every rank the same "
                                   "RXELAB_JOB_TOKEN")
    elif not isinstance(mine, SharedSecret):
        raise ConfigError(f"rank 0 has a job secret ({info['secret']}), this rank has none",
                          hint="give every rank the same RXELAB_JOB_TOKEN, or none")
    return bootstrap.JobInfo(rank, size, info["host"], info["port"], SOURCE, mine,
                             launch_id=info["launch"]), None


def _publish(store: Any, size: int, mine: Credential | None, source: str, host: str, *,
             under_srun: bool) -> tuple[bootstrap.JobInfo, socket.socket]:
    if mine is None:
        secret, source = secrets.token_hex(32), FROM_STORE
        store.set(SECRET_KEY, secret)
        mine = SharedSecret.of(secret, source)
        if under_srun:
            log.warning(IN_STORE_UNDER_SRUN)
    try:
        listener = addresses.any_address(0)  # a job with a secret: every address, a free port
    except OSError as err:
        raise ConfigError(f"rank 0 cannot listen for the job's rendezvous: {err}") from None
    port, launch = listener.getsockname()[1], secrets.token_hex(8)
    try:
        store.set(WHERE_KEY, json.dumps({"host": host, "port": port, "launch": launch,
                                         "secret": source}))
    except BaseException:
        listener.close()
        raise
    return bootstrap.JobInfo(0, size, host, port, SOURCE, mine, launch_id=launch), listener


def _read(store: Any, wait_s: float) -> dict[str, Any]:
    try:
        store.wait([WHERE_KEY], timedelta(seconds=wait_s))
    except RuntimeError as err:  # torch's store says it timed out, or lost its server
        raise PeerError(f"rank 0 did not publish its rendezvous in torch's store within "
                        f"{wait_s:g} s ({str(err).splitlines()[0][:200]})", peer=0,
                        reason=Reason.SILENT,
                        hint="is rank 0 started, with the rxelab backend too?") from None
    raw = _text(_get(store, WHERE_KEY, "rank 0's rendezvous"), "rank 0's rendezvous", 1024)
    try:
        info = json.loads(raw)
    except ValueError:
        raise ProtocolError("rank 0's rendezvous in torch's store is not JSON") from None
    ok = (isinstance(info, dict) and isinstance(info.get("host"), str)
          and _HOST.fullmatch(info["host"]) is not None
          and isinstance(info.get("port"), int) and not isinstance(info["port"], bool)
          and 1 <= info["port"] <= 65535
          and isinstance(info.get("launch"), str) and re.fullmatch(r"[0-9a-f]{16}", info["launch"])
          and isinstance(info.get("secret"), str) and len(info["secret"]) <= 64)
    if not ok:
        raise ProtocolError(f"rank 0's rendezvous in torch's store is malformed: {raw[:200]!r}")
    return info


def _get(store: Any, key: str, what: str) -> Any:
    try:
        return store.get(key)
    except RuntimeError as err:  # torch's store: the key never came, or the store is gone
        raise PeerError(f"{what} could not be read from torch's store: "
                        f"{str(err).splitlines()[0][:200] if str(err) else type(err).__name__}",
                        peer=0, reason=Reason.SILENT) from None


def _text(value: Any, what: str, limit: int) -> str:
    data = bytes(value)
    if not data or len(data) > limit:
        raise ProtocolError(f"{what} in torch's store is empty or longer than {limit} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} in torch's store is not text") from None
