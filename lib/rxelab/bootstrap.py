"""Who am I, how many are we, where do we meet: read the way the launchers people already use
say it, so a program starts unchanged under torchrun, mpirun, srun or our own launcher.

Explicit arguments win over the environment; among environments torchrun's names come
first, then Open MPI's, then Slurm's. The rendezvous (rank 0's TCP address) comes from
MASTER_ADDR/MASTER_PORT, or RXELAB_MASTER_ADDR/PORT. Under srun, which sets neither, it is
the step's first node (rxelab.hostlist) and the first free of a few ports drawn from the job
and step ids (slurm_ports): a port another user or job holds there moves rank 0 to the next,
and the others dial each in turn until one proves itself (rxelab.control.rendezvous).

A job's secret keeps strangers out of its control plane: RXELAB_JOB_TOKEN (our launcher
passes one on each rank's standard input, never on a command line), or the file
RXELAB_JOB_TOKEN_FILE names (the caller's own, readable by nobody else), or under Open MPI's
mpirun the random key it gives every job (OMPI_MCA_orte_precondition_transports). It never
travels: the ranks prove to each other that they hold it (rxelab.control.handshake). A secret of less
than 128 bits is refused (`rxelab-launch --new-token` makes one).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field

from rxelab import hostlist
from rxelab.control import handshake, munge_credential
from rxelab.control.handshake import OPEN, Credential, SharedSecret
from rxelab.errors import ConfigError

DEFAULT_PORT = 29500
# srun: ports SLURM_PORT_BASE.. (below Linux's ephemeral range), 16 steps per job, so the jobs
# that share a first node at once (their ids close together) do not share a first port; then
# SLURM_CANDIDATES - 1 more, drawn by a hash, for when it is taken
SLURM_PORT_BASE, SLURM_PORTS, SLURM_STEPS = 12000, 20000, 16
SLURM_CANDIDATES = 8
MAX_RANKS = 16384  # every schedule's sub-tags fit 16 bits up to this (rxelab.collectives.common)
SOURCES = (
    ("torchrun", "RANK", "WORLD_SIZE"),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS"),
    ("PMI", "PMI_RANK", "PMI_SIZE"),
)


@dataclass(frozen=True)
class JobInfo:
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    source: str  # which launcher's variables (or "arguments") said so
    # what its ranks prove (rxelab.control.handshake)
    credential: Credential = field(default=OPEN, repr=False)
    job_id: str = ""  # drawn by rank 0 when the job forms (rxelab.control.plane); "" until then
    launch_id: str = ""  # the launcher's own id of this job (torchrun's, Slurm's), if any
    more_ports: tuple[int, ...] = ()  # srun: rendezvous ports tried after master_port, in order

    @property
    def secured(self) -> bool:
        return self.credential.secured

    def scope(self) -> str:
        """What a hello's handshake is bound to: the job once it has its id, else its
        rendezvous (port, size and the launcher's id of the job: a relay to another job's
        rank 0 fails, even one with the same secret)."""
        return self.job_id or " ".join(
            x for x in ("rendezvous", str(self.master_port), str(self.world_size), self.launch_id) if x)


def _int(value: object, name: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a whole number") from None


def discover(
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    env: Mapping[str, str] | None = None,
) -> JobInfo:
    env = os.environ if env is None else env
    source = "arguments"
    if rank is None or world_size is None:
        for name, rank_var, size_var in SOURCES:
            if rank_var in env and size_var in env:
                rank = _int(env[rank_var], rank_var) if rank is None else rank
                world_size = _int(env[size_var], size_var) if world_size is None else world_size
                source = name
                break
    if rank is None or world_size is None:
        if world_size in (None, 1) and rank in (None, 0):
            rank, world_size, source = 0, 1, "default (single process)"
        else:
            raise ConfigError("rank and world size must be given together",
                              hint="pass both, or set RANK and WORLD_SIZE")
    addr = master_addr or env.get("MASTER_ADDR") or env.get("RXELAB_MASTER_ADDR")
    if addr is None and source == "Slurm":
        addr = slurm_first_node(env)
    more: list[int] = []  # srun's further candidates (slurm_ports)
    if master_port is not None:
        port = _int(master_port, "master_port")
    elif env.get("RXELAB_MASTER_PORT"):
        port = _int(env["RXELAB_MASTER_PORT"], "RXELAB_MASTER_PORT")
    elif env.get("TORCHELASTIC_RUN_ID") and env.get("MASTER_PORT"):
        # under torchrun MASTER_PORT is torch's own store, listening already: use the next one
        port = _int(env["MASTER_PORT"], "MASTER_PORT") + 1
    elif source == "Slurm" and not env.get("MASTER_PORT") and env.get("SLURM_JOB_ID"):
        port, *more = slurm_ports(env)
    else:
        port = _int(env.get("MASTER_PORT") or DEFAULT_PORT, "MASTER_PORT")
    if world_size < 1:
        raise ConfigError(f"world size {world_size} must be at least 1")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside 0..{world_size - 1}")
    if not 1 <= port <= 65535:
        raise ConfigError(f"rendezvous port {port} is outside 1..65535")
    if addr is None:
        if world_size > 1:
            raise ConfigError("no rendezvous address for a job of several ranks",
                              hint="set MASTER_ADDR (rank 0's host) or pass master_addr=")
        addr = "127.0.0.1"
    if world_size > MAX_RANKS:
        raise ConfigError(f"world size {world_size} is more than the {MAX_RANKS} ranks rxelab "
                          "supports (its schedules' tags)")
    return JobInfo(rank, world_size, addr, port, source, credential(env), launch_id=launch_id(env),
                   more_ports=tuple(more))


def slurm_first_node(env: Mapping[str, str]) -> str | None:
    """The first node of the step (rank 0's under srun's block and cyclic distributions)."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name):
            return hostlist.first(env[name])
    return None


def slurm_port(env: Mapping[str, str]) -> int:
    """The first rendezvous port of a Slurm job's step."""
    return slurm_ports(env)[0]


def slurm_ports(env: Mapping[str, str]) -> tuple[int, ...]:
    """The rendezvous ports of a Slurm job's step, the same on every rank of it, in the order
    they are tried: rank 0 listens on the first free one on its node, the others dial each in
    turn and talk only to a listener that proves the job's credential. The first is spaced
    from the neighbouring jobs' and steps' (it repeats every 1,250 job ids); the others are
    drawn from a hash of job, step and a counter, so two jobs whose first ports meet part at
    the next. All are public: another user who holds every one of them can deny the step."""
    job = _int(env["SLURM_JOB_ID"], "SLURM_JOB_ID")
    step = _int(env.get("SLURM_STEP_ID") or "0", "SLURM_STEP_ID")
    ports = [SLURM_PORT_BASE + (job * SLURM_STEPS + step % SLURM_STEPS) % SLURM_PORTS]
    counter = 0
    while len(ports) < SLURM_CANDIDATES:
        drawn = hashlib.sha256(f"rxelab srun rendezvous {job} {step} {counter}".encode()).digest()
        port = SLURM_PORT_BASE + int.from_bytes(drawn[:8], "big") % SLURM_PORTS
        counter += 1
        if port not in ports:
            ports.append(port)
    return tuple(ports)


def launch_id(env: Mapping[str, str]) -> str:
    """The launcher's id of this job, where it gives one every rank sees (torchrun's run id,
    Slurm's job and step): part of what a hello is bound to."""
    raw = env.get("TORCHELASTIC_RUN_ID") or (
        f"slurm-{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}" if env.get("SLURM_JOB_ID")
        else "")
    return "".join(c for c in raw if c.isalnum() or c in "._-")[:64]



def credential(env: Mapping[str, str]) -> Credential:
    """The job's credential: its secret (rxelab.control.handshake); under Slurm without one, MUNGE, the
    cluster's own (rxelab.control.munge_credential); OPEN when it has neither."""
    secret, source = job_secret(env)
    if secret:
        return SharedSecret.of(secret, source)
    if env.get("SLURM_JOB_ID") and munge_credential.available():
        return munge_credential.MungeCredential()
    return OPEN


def job_secret(env: Mapping[str, str]) -> tuple[str, str]:
    """The job's shared secret and where it came from, or ("", "")."""
    if env.get("RXELAB_JOB_TOKEN"):
        handshake.require_strong(env["RXELAB_JOB_TOKEN"], "RXELAB_JOB_TOKEN")
        return env["RXELAB_JOB_TOKEN"], "RXELAB_JOB_TOKEN"
    if path := env.get("RXELAB_JOB_TOKEN_FILE"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                info = os.fstat(f.fileno())
                data = f.read(4097)
        except OSError as err:
            raise ConfigError(f"RXELAB_JOB_TOKEN_FILE={path}: {err.strerror or err}") from None
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise ConfigError(f"RXELAB_JOB_TOKEN_FILE={path} is readable by others",
                              hint="a job's secret must be a file only its owner can read: chmod 600")
        if info.st_uid != os.geteuid():
            raise ConfigError(f"RXELAB_JOB_TOKEN_FILE={path} belongs to uid {info.st_uid}, not "
                              f"to this process's user (uid {os.geteuid()})",
                              hint="a job's secret must be your own file: whoever owns it can "
                                   "read or change it")
        secret = data.decode(errors="replace").strip()
        if not secret or len(data) > 4096:
            raise ConfigError(f"RXELAB_JOB_TOKEN_FILE={path} must hold one secret line")
        handshake.require_strong(secret, f"RXELAB_JOB_TOKEN_FILE={path}")
        return secret, "RXELAB_JOB_TOKEN_FILE"
    key = env.get("OMPI_MCA_orte_precondition_transports", "")
    if key and "OMPI_COMM_WORLD_SIZE" in env and open_mpi_key_is_secret(key):
        return key, "Open MPI's job key"
    return "", ""


def open_mpi_key_is_secret(key: str) -> bool:
    """mpirun's (ORTE's) key is two 64-bit numbers from /dev/urandom, 16 hex digits each,
    joined by '-': 128 bits. Where Open MPI made it from the job's ids instead (direct launch:
    '012cc14200000000-012cc14200000000') it is no secret: not taken (the job falls back to
    MUNGE, or to none, saying so)."""
    first, dash, second = key.partition("-")
    return (bool(dash) and len(first) == len(second) == 16 and first != second
            and set(key.lower()) - {"-"} <= handshake.HEX_DIGITS
            and handshake.weakness(first + second) is None)
