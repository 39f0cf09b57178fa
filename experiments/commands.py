"""What the runner sends to the nodes, as text: the command of each kind of case (our launcher,
mpirun over UCX or TCP, a perftest pair), the per-node set-up and restore around a case (MTU,
netem, counters), and the parsing of what comes back. Pure functions, so every command can be
checked without a lab.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from experiments import counters, fleet, netem
from experiments.spec import MPI_ALGORITHMS
from infra.inventory import Host

# Each name starts with a bracket so the pattern does not match the shell running pkill,
# whose own command line holds it (that shell would be killed before the commands after it).
CLEANUP = ("pkill -u \"$(id -un)\" -f '[s]erver_client.py|[m]pi_compare.py|[r]xelab.launch|"
           "[l]oad_sampler.py|[i]b_write_bw|[i]b_send_bw|[i]b_send_lat|[o]rted|[m]pirun' || true")
PERFTEST_PORT = 18515
TIMED_OUT = 124  # what `timeout` and our launcher exit with when the deadline passed


def case_timeout(case: dict[str, Any]) -> float:
    """The spec's deadline, or a generous one under emulation: ~40 ms per small stage, ~5 MB/s
    per node pair, more under loss."""
    if case.get("timeout_s"):
        return float(case["timeout_s"])
    volume = case["size"] * case["nodes"] * (case["stages"] + case["warmup"])
    slower = 1 + 5 * float(case.get("netem", {}).get("loss", 0))
    return 180 + (0.2 * (case["stages"] + case["warmup"]) + volume / 1e6) * slower


def rxelab_command(case: dict[str, Any], hosts: list[Host], port: int) -> str:
    p = fleet.remote_paths()
    app = (f"python3 {p['apps']}/server_client.py --op {case['op']} --algorithm "
           f"{case['algorithm']} --size {case['size']} --stages {case['stages']} "
           f"--warmup {case['warmup']}")
    for key in ("qp_timeout", "retry_cnt", "eager_limit", "pairs"):
        if case.get(key) is not None:
            app += f" --{key.replace('_', '-')} {case[key]}"
    return (f"PYTHONPATH={p['lib']} python3 -m rxelab.launch --hosts "
            f"{','.join(h.data_ip for h in hosts)} --per-host {case.get('ranks_per_node') or 1} "
            f"--port {port} --timeout {case_timeout(case):.0f} -- {app}")


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


def mpi_transport_args(transport: str, hosts: list[Host], netdev: str) -> list[str]:
    if transport == "tcp":
        return ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include",
                netdev]
    exports = [a for k, v in ucx_settings(hosts[0]).items() for a in ("-x", f"{k}={v}")]
    return ["--mca", "pml", "ucx", "--mca", "btl", "^openib,uct", *exports]


def mpi_command(case: dict[str, Any], hosts: list[Host], netdev: str) -> str:
    p = fleet.remote_paths()
    forced = MPI_ALGORITHMS[case["op"]][case["algorithm"]]
    mca = [] if forced is None else [
        "--mca", "coll_tuned_use_dynamic_rules", "1",
        "--mca", f"coll_tuned_{case['op']}_algorithm", str(forced)]
    argv = ["timeout", f"{case_timeout(case):.0f}", "mpirun", "-np", str(len(hosts)),
            "--host", ",".join(h.data_ip for h in hosts), "--mca", "oob_tcp_if_include", netdev,
            "-x", f"PYTHONPATH={p['lib']}",  # the app reads rxelab's description of the ops
            *mpi_transport_args(case["transport"], hosts, netdev), *mca,
            "python3", f"{p['apps']}/mpi_compare.py", "--op", case["op"],
            "--algorithm", case["algorithm"], "--size", str(case["size"]),
            "--stages", str(case["stages"]), "--warmup", str(case["warmup"])]
    # $HOME must reach the remote shell unquoted; everything else is quoted
    return " ".join(a if "$HOME" in a else shlex.quote(a) for a in argv)


def perftest_argv(case: dict[str, Any], host: Host) -> list[str]:
    tool = case["algorithm"]
    argv = [tool, "-d", host.rdma.device, "-i", str(host.rdma.port), "-x", str(host.rdma.gid_index),
            "-F", "-s", str(max(case["size"], 1 if tool != "ib_send_lat" else 2)),
            "-n", str(case["stages"]), "-p", str(PERFTEST_PORT)]
    return argv if tool == "ib_send_lat" else [*argv, "--report_gbits"]


def parse_perftest(tool: str, text: str, size: int) -> dict[str, Any] | None:
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0].isdigit() and all(re.fullmatch(r"[\d.]+", x) for x in f[1:5]):
            rec: dict[str, Any] = {"record": "summary", "app": "perftest", "op": tool, "size": size,
                                   "iterations": int(f[1]), "ok": True}
            if tool == "ib_send_lat":  # bytes iters t_min t_max t_typical t_avg ...
                rec["lat_us"] = float(f[4])
            else:  # bytes iters bw_peak bw_avg[Gb/s] msg_rate
                rec["bw_MBps"] = float(f[3]) * 1e9 / 8 / 1e6
            return rec
    return None


# ---- around a case, on each node ----------------------------------------------------------
def netdev_expr(host: Host) -> str:
    """Shell that sets $nd to the netdev under the RDMA port's GID (data0 in the lab)."""
    r = host.rdma
    return f"nd=$(cat /sys/class/infiniband/{r.device}/ports/{r.port}/gid_attrs/ndevs/{r.gid_index})"


def prepare_command(host: Host, case: dict[str, Any]) -> str:
    """Set the case's MTU and impairment, then print the netdev's MTU, the port's active MTU
    and the device counters (the 'before' reading)."""
    steps = [netdev_expr(host)]
    if case.get("mtu"):
        steps.append(f"sudo -n ip link set dev \"$nd\" mtu {int(case['mtu'])}")
    steps.append(netem.apply_command('"$nd"', case.get("netem", {})))
    return " && ".join(f"{{ {s}; }}" for s in steps) + " || exit 3; " + readings_command(host)


def restore_command(host: Host, mtu: int | None) -> str:
    """Remove any impairment, put the MTU back, print the 'after' reading."""
    steps = [netdev_expr(host), netem.clear_command('"$nd"')]
    if mtu:
        steps.append(f"sudo -n ip link set dev \"$nd\" mtu {int(mtu)}")
    return "; ".join(steps) + "; " + readings_command(host)


def readings_command(host: Host) -> str:
    r = host.rdma
    return (f"{netdev_expr(host)}; echo \"netdev_mtu $(cat /sys/class/net/$nd/mtu)\"; "
            f"echo \"active_mtu $(ibv_devinfo -d {r.device} -i {r.port} 2>/dev/null "
            f"| sed -n 's/.*active_mtu:[^0-9]*\\([0-9]*\\).*/\\1/p')\"; {counters.read_command(host)}")


def parse_readings(text: str) -> dict[str, Any]:
    """netdev_mtu, active_mtu and the counters from readings_command's output."""
    out: dict[str, Any] = {"counters": counters.parse(text)}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in ("netdev_mtu", "active_mtu") and value.strip().isdigit():
            out[key] = int(value)
    return out
