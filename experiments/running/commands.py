"""What the runner sends to the nodes, as text: the command of each kind of case (our launcher
running rxelab or Gloo, mpirun over UCX or TCP, a perftest pair), the per-node set-up and
restore around a case (MTU, netem, counters), and the parsing of what comes back. Pure
functions, so every command can be checked without a lab.

The nodes may be a user's own machines, so a run touches only what it starts or changes:
every process it starts carries the run's id in its environment (RXELAB_RUN_ID), and the
clean-up stops exactly those; netem goes only onto a NIC whose root qdisc is the kernel's
default and is removed only where it was put; MTUs go back to what they were. Inventory values
reach the shell quoted.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from typing import TypedDict

from rxelab import ops, perftest
from rxelab import settings as library

from experiments.running import counters, fleet
from experiments.running.records import Summary
from experiments.spec import Case, netem
from infra import rdmaport
from infra.inventory import Host

RUN_ID = "RXELAB_RUN_ID"
STOP_GRACE_S = 5
TIMED_OUT = 124  # what `timeout` and our launcher exit with when the deadline passed


# A deadline's TERM is followed by KILL this many seconds later: mpirun (PRRTE) whose daemon on
# a node that died (a guest kernel's panic, 2026-12-02) never answers ignores TERM and waited
# for ever, and the case with it.
KILL_AFTER_S = 30


def case_timeout(case: Case) -> float:
    """The spec's deadline, or a generous one under emulation: ~40 ms per small stage, ~5 MB/s
    per node pair, more under loss; on a long link, a round trip per node and step of a
    stage, and the rate cap's time for the volume."""
    if case.timeout_s:
        return float(case.timeout_s)
    stages = case.stages + case.warmup
    volume = case.size * case.nodes * stages
    slower = 1 + 5 * float(case.netem.get("loss", 0))
    rtt_s = 2 * float(case.netem.get("delay_ms", 0)) / 1000
    rate = float(case.netem.get("rate_mbit", 0)) * 1e6 / 8
    capped = 2 * volume / rate if rate else 0.0
    return 180 + (0.2 * stages + volume / 1e6) * slower + 4 * case.nodes * stages * rtt_s * slower \
        + capped + 50 * rtt_s


def started_by(run_id: str) -> str:
    """The prefix of every command a run starts: its processes carry the run's id."""
    return f"{RUN_ID}={shlex.quote(run_id)} "


def stop_command(*run_ids: str, say_left: bool = False) -> str:
    """Stop this user's processes that carry one of these run ids in their environment (TERM,
    then KILL after a grace period) and nothing else: a user's own MPI jobs, other runs and
    this shell (which carries no id) are left alone. One grep over every process's environment
    per look (other users' are unreadable to it), so a host with thousands of processes is
    looked at in a moment. say_left: then print `left` and the pids of any still there."""
    ids = " ".join(f"-e {shlex.quote(f'{RUN_ID}={r}')}" for r in run_ids)
    find = f"ours() {{ grep -lsxzF {ids} /proc/[0-9]*/environ | cut -d/ -f3; }}"
    left = '; pids=$(ours); [ -z "$pids" ] || echo left $pids' if say_left else ""
    return (f"{find}; pids=$(ours); [ -z \"$pids\" ] || kill -TERM $pids 2>/dev/null; "
            f"for i in $(seq {STOP_GRACE_S * 5}); do [ -z \"$(ours)\" ] && break; sleep 0.2; done; "
            f"pids=$(ours); [ -z \"$pids\" ] || kill -KILL $pids 2>/dev/null; true{left}")


def app_argv(case: Case, script: str) -> list[str]:
    """One of the apps (they take the same flags) on the case, run by the venv's python (the
    wheel's rxelab: the apps read its description of the ops)."""
    p = fleet.remote_paths()
    return [p["python"], f"{p['apps']}/{script}", "--op", case.op, "--algorithm",
            case.algorithm, "--size", str(case.size), "--stages", str(case.stages),
            "--warmup", str(case.warmup), *(["--tight"] if case.tight else []),
            *(["--data", case.data] if case.data else [])]


def rxelab_app(case: Case) -> list[str]:
    """The demo app of an rxelab case, with init()'s options as flags."""
    app = app_argv(case, "server_client.py")
    flags = [(name, case.option(name)) for name in library.BY_NAME]
    for key, value in (*flags, ("pairs", case.pairs), ("compression", case.compression),
                       ("transport", case.rxelab_transport)):
        if value is not None:
            app += [f"--{key.replace('_', '-')}", str(value)]
    return app


def rxelab_command(case: Case, hosts: list[Host], port: int, run_id: str) -> str:
    p = fleet.remote_paths()
    argv = [p["python"], "-m", "rxelab.launch", "--hosts", ",".join(h.data_ip for h in hosts),
            "--per-host", str(case.ranks_per_node or 1), "--port", str(port),
            "--timeout", f"{case_timeout(case):.0f}", "--", *rxelab_app(case)]
    return started_by(run_id) + remote_join(argv)


def gloo_app(case: Case) -> list[str]:
    return app_argv(case, "gloo_compare.py")


def gloo_command(case: Case, hosts: list[Host], port: int, run_id: str) -> str:
    """torch.distributed over Gloo (apps/gloo_compare.py), started by our launcher as torchrun
    would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); the app finds the interface on the
    data network from MASTER_ADDR."""
    p = fleet.remote_paths()
    argv = [p["python"], "-m", "rxelab.launch", "--hosts", ",".join(h.data_ip for h in hosts),
            "--port", str(port), "--timeout", f"{case_timeout(case):.0f}", "--", *gloo_app(case)]
    return started_by(run_id) + remote_join(argv)


# What a remote shell expands itself in an argument of ours: each stays one word ("$HOME": a
# home with a space in it; "$(hostname)": the node's own name).
LEFT_TO_THE_NODE = ("$HOME", "$(hostname)")
_LEFT = re.compile("(" + "|".join(re.escape(w) for w in LEFT_TO_THE_NODE) + ")")


def remote_word(arg: str) -> str:
    """One argument for a remote shell, quoted, with each word of LEFT_TO_THE_NODE in it left
    for that shell to expand (double-quoted)."""
    return "".join(f'"{part}"' if part in LEFT_TO_THE_NODE else (shlex.quote(part) if part else "")
                   for part in _LEFT.split(arg))


def mpi_hosts(hosts: list[Host], slots: int = 1) -> str:
    """mpirun's --host list: the first node (where mpirun runs) by its own hostname, the others
    by their data addresses. Open MPI 5's runtime (PRRTE) matches a --host entry to its own
    node by name only, so the head's data address matched no node ("not enough slots"); the
    others' daemons are matched by the addresses they report (infra.config's mgmt_net)."""
    return ",".join([f"$(hostname):{slots}"] + [f"{h.data_ip}:{slots}" for h in hosts[1:]])


def remote_join(argv: list[str]) -> str:
    return " ".join(remote_word(a) for a in argv)


def ucx_settings(host: Host, ranks_per_host: int = 1) -> dict[str, str]:
    """Open MPI over UCX on the RDMA device. UCX <= 1.18 takes a RoCE UD packet's IP version
    from the completion's service level, which rxe leaves unset, so with an IPv4 GID it drops
    every UD packet; UD also wires up RC (rc_v = rc_verbs + a ud_verbs helper).
    UCX_UD_ETH_DGID_CHECK=n skips that check (fixed upstream in UCX 1.19)."""
    return {
        "UCX_NET_DEVICES": f"{host.rdma.device}:{host.rdma.port}",
        "UCX_TLS": "rc_v,self" + (",sm" if ranks_per_host > 1 else ""),
        "UCX_UD_ETH_DGID_CHECK": "n",
        "UCX_IB_GID_INDEX": str(host.rdma.gid_index),
    }


# Open MPI over UCX, whoever starts it (a case, the elastic scenario, srun) and whatever the
# report says it ran with (report/run_facts.py)
UCX_MCA = {"pml": "ucx", "btl": "^openib,uct"}


def mca_args(mca: dict[str, str]) -> list[str]:
    return [a for k, v in mca.items() for a in ("--mca", k, v)]


def export_args(env: dict[str, str]) -> list[str]:
    return [a for k, v in env.items() for a in ("-x", f"{k}={v}")]


def mpi_settings(case: Case, hosts: list[Host],
                 network: str) -> tuple[dict[str, str], dict[str, str]]:
    """(MCA parameters, environment) of an Open MPI case, whatever starts it: the transport
    (UCX on the RDMA device, or ob1's TCP on the data network) and the collective algorithm
    the case forces through coll_tuned. mpirun takes them as --mca and -x, srun as the
    OMPI_MCA_* and other variables of its environment."""
    if case.transport == "tcp":
        mca, env = {"pml": "ob1", "btl": "tcp,self", "btl_tcp_if_include": network}, {}
    else:
        mca, env = dict(UCX_MCA), ucx_settings(hosts[0])
    described = ops.COLLECTIVES[case.op].mpi
    assert described is not None, "spec validation lets only collectives with an MPI counterpart through"
    forced = described.tuned[case.algorithm]
    if forced is not None:
        mca.update({"coll_tuned_use_dynamic_rules": "1",
                    f"coll_tuned_{case.op}_algorithm": str(forced)})
    return mca, env


def mpi_app(case: Case) -> list[str]:
    return app_argv(case, "mpi_compare.py")


def mpi_command(case: Case, hosts: list[Host], network: str, run_id: str) -> str:
    """network: the data network as Open MPI's if_include takes it (a CIDR such as
    10.10.0.0/24, or interface names), found on the hosts themselves, never assumed."""
    mca, env = mpi_settings(case, hosts, network)
    argv = ["timeout", "-k", str(KILL_AFTER_S), f"{case_timeout(case):.0f}", "mpirun", "-np", str(len(hosts)),
            "--host", mpi_hosts(hosts), "--mca", "oob_tcp_if_include", network,
            "-x", RUN_ID,  # the ranks carry the run's id too: the clean-up finds them
            *mca_args(mca), *export_args(env), *mpi_app(case)]
    return started_by(run_id) + remote_join(argv)


def perftest_command(case: Case, host: Host, run_id: str, server_ip: str = "") -> str:
    """One side of a perftest pair (the server without server_ip), under the case's deadline."""
    argv = ["timeout", "-k", str(KILL_AFTER_S), f"{case_timeout(case):.0f}", *perftest_argv(case, host)]
    return started_by(run_id) + shlex.join([*argv, *([server_ip] if server_ip else [])])


def perftest_argv(case: Case, host: Host) -> list[str]:
    r = host.rdma
    return perftest.argv(case.algorithm, r.device, r.port, r.gid_index, case.size, case.stages)


def parse_perftest(tool: str, text: str, size: int) -> Summary | None:
    found = perftest.parse(tool, text)
    if found is None:
        return None
    return Summary.model_validate({"record": "summary", "app": "perftest", "op": tool, "size": size,
                                   "iterations": found.pop("iterations"), "ok": True, **found})


# ---- around a case, on each node ----------------------------------------------------------
# tc's `show` needs no root, but /sbin may not be on a user's PATH
TC = 'tc=$(command -v tc || echo /sbin/tc)'
# The kernel's own root qdisc has handle 0: (mq, fq_codel, pfifo_fast, noqueue); one a user set
# has another. netem replaces the root qdisc, so it goes only where the kernel's default is.
DEFAULT_ROOT = ('q=$($tc qdisc show dev "$nd" root | head -n 1); case "$q" in *" 0: root"*) ;; '
                '*) echo "the data NIC $nd has a root qdisc of its own ($q): netem would replace '
                'it; remove it or run this spec without netem" >&2; exit 4;; esac')


def netem_handle(run_id: str) -> str:
    """The run's own qdisc handle (hex, 1..fff0): its netem is the one under it."""
    return f"{int(run_id[:4], 16) % 0xFFF0 + 1:x}"


def prepare_command(host: Host, case: Case, run_id: str) -> str:
    """Set the case's MTU and impairment, then print the netdev's MTU, the port's active MTU
    and the device counters (the 'before' reading)."""
    steps = [rdmaport.netdev_assign(host.rdma)]
    if case.mtu:
        steps.append(f"sudo -n ip link set dev \"$nd\" mtu {int(case.mtu)}")
    if any(case.netem.values()):
        steps += [TC, DEFAULT_ROOT, netem.apply_command('"$nd"', case.netem, netem_handle(run_id))]
    return " && ".join(f"{{ {s}; }}" for s in steps) + " || exit 3; " + readings_command(host)


def restore_command(host: Host, mtu: int | None, run_id: str, netem_applied: bool = False) -> str:
    """Undo what this run changed, nothing else: remove the netem under the run's own handle,
    put the MTU back; then print the 'after' reading (with `netem_ours absent` once the
    impairment is gone)."""
    steps = [rdmaport.netdev_assign(host.rdma)]
    if netem_applied:
        steps += [TC, netem.clear_command('"$nd"', netem_handle(run_id), "$tc")]
    if mtu:
        steps.append(f"sudo -n ip link set dev \"$nd\" mtu {int(mtu)}")
    return "; ".join(steps) + "; " + readings_command(host)


def readings_command(host: Host) -> str:
    """Prints the netdev under the RDMA port's GID, its MTU and addresses, the port's active
    MTU and the device counters."""
    r = host.rdma
    return (f"{rdmaport.netdev_assign(r)}; echo \"netdev $nd\"; "
            f"echo \"netdev_mtu $({rdmaport.netdev_mtu()})\"; "
            "ip -o addr show dev \"$nd\" scope global 2>/dev/null | awk '{print \"inet\", $4}'; "
            f"echo \"active_mtu $({rdmaport.active_mtu(r)})\"; {counters.read_command(host)}")


IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # a Linux interface name as the lab's NICs have


class Readings(TypedDict, total=False):
    """What readings_command printed, each key only where a node said it."""

    counters: dict[str, int]  # the RDMA device's
    inet: list[str]  # the data NIC's addresses
    netdev: str  # the data NIC under the RDMA port's GID
    netdev_mtu: int
    active_mtu: int  # the RoCE path MTU
    netem_gone: bool  # after a restore: the run's impairment is gone (or never was)


def parse_readings(text: str) -> Readings:
    """netdev, its MTU and addresses, active_mtu and the counters from readings_command's output."""
    out = Readings(counters=counters.parse(text), inet=[])
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "netem_ours":
            out["netem_gone"] = value.strip() == "absent"
        elif key == "netdev_mtu" and value.strip().isdigit():
            out["netdev_mtu"] = int(value)
        elif key == "active_mtu" and value.strip().isdigit():
            out["active_mtu"] = int(value)
        elif key == "netdev" and IFNAME.fullmatch(value.strip()):  # a node's word, checked:
            out["netdev"] = value.strip()  # it goes into later commands and the environment
        elif key == "inet" and value.strip():
            out.setdefault("inet", []).append(value.strip())
    return out


def data_network(host: Host, inets: list[str]) -> str | None:
    """The network (CIDR) of the host's data address among the netdev's addresses."""
    for inet in inets:
        try:
            iface = ipaddress.ip_interface(inet)
        except ValueError:
            continue
        if iface.ip == ipaddress.ip_address(host.data_ip):
            return str(iface.network)
    return None
