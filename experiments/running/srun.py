"""Cases started by Slurm (a spec's `launcher = "srun"`): what a cluster's users do, so the
runner measures what they would get. rxelab's ranks find rank, size, rendezvous and the job's
credential in Slurm's own variables; Open MPI's start under `srun --mpi=pmix` with their MCA
parameters in the environment; Gloo's take theirs from Slurm through its app.

Slurm is someone else's engine here: the runner names every job it starts after its run
(`rxelab-<run id>`), asks Slurm for that name's jobs of this user only, and cancels exactly
those ids. The nodes are named as Slurm knows them (each node's `hostname -s`, checked against
`scontrol show node`), never assumed from the inventory.
"""

from __future__ import annotations

import math
import re
import shlex

from experiments.running import commands
from experiments.running.commands import case_timeout, started_by
from experiments.spec import Case
from infra.inventory import Host

JOB_PREFIX = "rxelab-"
# After an MPI job's first rank ends, srun ends the others this much later. Debian 12's Open
# MPI 4.1.4 under Slurm's PMIx can lose a rank's finalize fence: that rank leaves while the
# others still close their UCX endpoints to it, and they wait for it forever (seen on the lab
# with pml_ucx_verbose: the rank that left never waited at the fence). The figures are printed
# before finalize, so the case keeps them and its record says how the job ended.
MPI_WAIT_S = 15
# A Slurm node name as `hostname -s` and scontrol print it: what may reach --nodelist.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# States in which a node takes no new job (scontrol's State=: a base state, flags after '+';
# a '*' after a state means not responding). A node that is busy or reserved takes one later:
# srun --immediate turns that wait into an error that says so.
UNUSABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "FUTURE", "INVALID_REG", "MAINTENANCE",
            "REBOOT_ISSUED")
# How long a case's srun waits for its nodes before it fails, saying why.
ALLOCATE_S = 120


def job_name(run_id: str) -> str:
    return JOB_PREFIX + run_id


# ---- finding the nodes as Slurm knows them ----------------------------------------------
# The first State= and CPUTot= of the node's one line (a Reason= after them may say anything).
PROBE = ('n=$(hostname -s); echo "slurm_node $n"; '
         'echo "slurm_srun $(command -v srun || true)"; '
         'line=$(scontrol show node -o "$n" 2>/dev/null); '
         'for k in State CPUTot; do echo "slurm_$k $(printf %s "$line" | grep -o " $k=[^ ]*" '
         '| head -n 1 | cut -d= -f2)"; done')


def parse_probe(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key in ("slurm_node", "slurm_srun", "slurm_State", "slurm_CPUTot"):
            found[key.removeprefix("slurm_").lower()] = value.strip()
    return found


def node_problem(host: Host, found: dict[str, str]) -> str | None:
    """Why this node cannot take the run's srun jobs, or None."""
    name, state = found.get("node", ""), found.get("state", "")
    if not found.get("srun"):
        return f"{host.name}: no srun on this node (launcher = \"srun\" needs Slurm's client)"
    if not NODE_NAME.match(name):
        return f"{host.name}: its host name {name!r} is not a Slurm node name"
    if not state:
        return (f"{host.name}: Slurm knows no node {name!r} (scontrol show node; a node's Slurm "
                "name is taken to be its `hostname -s`); is slurmd running there, and slurmctld "
                "reachable?")
    if any(flag.rstrip("*") in UNUSABLE or flag.endswith("*") for flag in state.upper().split("+")):
        return f"{host.name}: Slurm node {name} is {state}: it takes no job"
    return None


def placement_problems(slurm_nodes: dict[str, str], cpus: dict[str, int],
                       ranks_per_node: int) -> list[str]:
    """Why the run's cases cannot start as the spec says: two hosts that are one Slurm node
    (srun would add a node of its own choosing to make up the count), or more ranks per node
    than a node has CPUs (srun refuses such a step)."""
    problems = []
    by_name: dict[str, list[str]] = {}
    for host, name in slurm_nodes.items():
        by_name.setdefault(name, []).append(host)
    problems += [f"{', '.join(hosts)} are one Slurm node, {name}"
                 for name, hosts in by_name.items() if len(hosts) > 1]
    problems += [f"{host} ({slurm_nodes[host]}) has {n} CPUs in Slurm, the spec asks for "
                 f"{ranks_per_node} ranks per node" for host, n in cpus.items() if n < ranks_per_node]
    return problems


# ---- a case's command -------------------------------------------------------------------
def srun_argv(case: Case, nodes: list[str], run_id: str, *extra: str) -> list[str]:
    """srun on exactly these nodes, a task per rank, under the case's deadline twice over:
    `timeout` ends srun (which ends its step), Slurm's own time limit ends the job. No task
    reads the SSH session's input (srun would hand it to task 0). Nodes busy with other jobs
    make srun fail after ALLOCATE_S, saying so, rather than wait out the deadline."""
    deadline = case_timeout(case)
    return ["timeout", f"{deadline:.0f}", "srun", f"--job-name={job_name(run_id)}",
            f"--nodes={len(nodes)}", f"--ntasks-per-node={case.ranks_per_node or 1}",
            f"--nodelist={','.join(nodes)}", f"--time={math.ceil(deadline / 60) + 1}",
            # whatever the caller's SLURM_EXPORT_ENV and SLURM_DISTRIBUTION say: the ranks get
            # the run's id and settings, rank 0 is on the step's first node
            "--export=ALL", "--distribution=block", f"--immediate={ALLOCATE_S}",
            "--kill-on-bad-exit=1", "--input=none", "--quiet", *extra]


def _environment(pairs: dict[str, str]) -> str:
    return "".join(f"{k}={shlex.quote(v)} " for k, v in pairs.items())


def rxelab_command(case: Case, nodes: list[str], run_id: str) -> str:
    """The demo app under srun: no launcher, no port, no secret - Slurm's variables and MUNGE."""
    argv = [*srun_argv(case, nodes, run_id), *commands.rxelab_app(case)]
    return started_by(run_id) + commands.remote_join(argv)


def gloo_command(case: Case, nodes: list[str], run_id: str, netdev: str) -> str:
    """Gloo's ranks take rank and rendezvous from Slurm (through the app) and the data NIC
    from the runner: a node's name may resolve to another network (or to 127.0.1.1)."""
    argv = [*srun_argv(case, nodes, run_id), *commands.gloo_app(case)]
    return (started_by(run_id) + _environment({"GLOO_SOCKET_IFNAME": netdev})
            + commands.remote_join(argv))


def mpi_command(case: Case, hosts: list[Host], nodes: list[str], network: str,
                run_id: str) -> str:
    """Open MPI's ranks started by Slurm's PMIx: the same MCA parameters and UCX settings as
    under mpirun, as OMPI_MCA_* and UCX_* variables that srun passes on to every task."""
    mca, env = commands.mpi_settings(case, hosts, network)
    settings = {**{f"OMPI_MCA_{k}": v for k, v in mca.items()}, **env}
    argv = [*srun_argv(case, nodes, run_id, "--mpi=pmix", f"--wait={MPI_WAIT_S}"),
            *commands.mpi_app(case)]
    return started_by(run_id) + _environment(settings) + commands.remote_join(argv)


# ---- clean-up: this run's jobs, and nobody else's ----------------------------------------
def cancel_command(run_id: str) -> str:
    """Cancel the jobs of this user named after this run (by their ids), and say which."""
    name = shlex.quote(job_name(run_id))
    return (f'ids=$(squeue --noheader --user="$(id -un)" --name={name} --format=%i 2>/dev/null); '
            '[ -z "$ids" ] || { scancel $ids; echo "cancelled $ids"; }; true')
