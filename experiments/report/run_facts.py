"""What a report says of how a run ran, each fact read from its environment.json ("unknown"
where the run did not record it): how the nodes ran (and so what absolute numbers mean), the
versions, the RDMA devices and UCX settings of the MPI rows, the launcher, Gloo's torch."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from experiments.running import commands
from experiments.running.records import Environment, Record

EMULATION_NOTE = ("Absolute numbers here come from VMs under emulation (TCG) and are not hardware "
                  "numbers; the ratios between algorithms measured in the same run are what carry over.")
KVM_NOTE = ("Absolute numbers here come from VMs with hardware virtualization (KVM), not bare "
            "metal; with software RDMA (rxe) in the VMs, as the testbed runs them, they are not "
            "hardware numbers; the ratios between algorithms measured in the same run are what "
            "carry over.")
UNRECORDED_NOTE = ("How the nodes ran (emulated VMs, VMs with hardware virtualization or bare "
                   "metal) was not recorded for this run: read absolute numbers with that in mind.")
UNKNOWN = "unknown"
# Where a version comes from in environment.json: its name under "versions", then the Debian
# package of older runs (under "packages"), whose upstream part is taken.
VERSION_SOURCES = (("rxelab", "rxelab", None), ("Open MPI", "open_mpi", "openmpi-bin"),
                   ("UCX", "ucx", "libucx0"), ("rdma-core", "rdma_core", "rdma-core"))
DGID_CHECK = "UCX_UD_ETH_DGID_CHECK"


def text(value: object) -> str | None:
    """An env value as text, or None where the run did not record it ("?", empty, null).
    The text is untrusted (it comes from remote hosts): callers escape it for their output."""
    if value is None or isinstance(value, (dict, list)) and not value:
        return None
    text = str(value).strip()
    return None if text in ("", "?") else text


def active_mtu(env: Environment) -> str | None:
    """The RoCE path MTU (the RDMA port's active MTU) the run recorded: `active_mtu`, or
    `mtu` in runs before it had that name (their `mtu` was already the port's, never the data
    NIC's, which is `netdev_mtu`)."""
    return text(env.active_mtu if "active_mtu" in env.model_fields_set else env.mtu)


def upstream_version(debian: str) -> str:
    """The upstream part of a Debian version: no epoch, no Debian revision, no repack suffix
    ("1:4.1.4-3+b1" -> "4.1.4", "1.13.1+dfsg-1" -> "1.13.1", "44.0-2" -> "44.0")."""
    v = debian.split(":", 1)[1] if re.match(r"^\d+:", debian) else debian
    v = v.rsplit("-", 1)[0] if "-" in v else v
    return re.sub(r"[+~](dfsg|ds)\d*$", "", v) or debian


def versions(env: Environment) -> dict[str, str]:
    """The rxelab wheel's, Open MPI, UCX, rdma-core and kernel versions of the run, "unknown"
    where not recorded."""
    recorded, packages = env.versions, env.packages
    out = {}
    for name, key, package in VERSION_SOURCES:
        v = text(recorded.get(key))
        if v is None and package and (p := text(packages.get(package))) is not None:
            v = upstream_version(p)
        out[name] = v or UNKNOWN
    out["kernel"] = text(recorded.get("kernel")) or text(env.kernel) or UNKNOWN
    return out


def how_nodes_ran(env: Environment) -> tuple[str, str]:
    """(what the facts list says, the caveat above the report or "" for bare metal), from
    "accel" (tcg, kvm, none for bare metal, another hypervisor) and "virtualization"
    (systemd-detect-virt on the first node: qemu means emulation, kvm hardware virtualization)."""
    accel = (text(env.accel) or "").lower()
    virt = (text(env.virtualization) or "").lower()
    if accel == "tcg" or virt == "qemu":
        return "VMs under emulation (TCG)", EMULATION_NOTE
    if accel == "kvm" or virt == "kvm":
        return "VMs with hardware virtualization (KVM)", KVM_NOTE
    other = next((x for x in (accel, virt) if x and x != "none"), None)
    if other:
        return (f"virtualized ({other})",
                f"Absolute numbers here come from nodes virtualized by {other}, not bare metal; "
                "the ratios between algorithms measured in the same run are what carry over.")
    if "none" in (accel, virt):
        return "bare metal (no virtualization)", ""
    return "not recorded", UNRECORDED_NOTE


def rdma_devices(env: Environment) -> list[str]:
    """The RDMA device names of the run: per node where recorded, else UCX_NET_DEVICES's."""
    named = [d for d in (text(v) for v in env.rdma_devices.values()) if d]
    if named:
        return sorted(set(named))
    net = text(env.ucx_settings.get("UCX_NET_DEVICES"))
    return sorted({x.split(":", 1)[0] for x in net.split(",") if x}) if net else []


def mpi_rdma_note(env: Environment) -> str:
    """How the mpi-ucx rows ran, as recorded: versions, RDMA device and UCX settings, "unknown"
    where the run did not record them; and why UCX_UD_ETH_DGID_CHECK=n on rxe."""
    ver = versions(env)
    settings = {k: t for k, v in env.ucx_settings.items() if (t := text(v)) is not None}
    devices = ", ".join(rdma_devices(env)) or UNKNOWN
    mca = " ".join(commands.mca_args(commands.UCX_MCA))
    if settings:
        how = "with `" + " ".join([mca, *commands.export_args(settings)]) + "`"
    else:
        how = f"with `{mca}` and UCX settings that were not recorded for this run ({UNKNOWN})"
    dgid = settings.get(DGID_CHECK)
    if not settings:
        sets = "whether this run set it was not recorded"
    elif dgid is not None and dgid.lower() in ("n", "no", "0", "off", "false"):
        sets = "this run sets it"
    else:
        sets = f"this run did not set it ({DGID_CHECK}={dgid or UNKNOWN})"
    return (f"MPI over RDMA: Open MPI ({ver['Open MPI']}) runs over the RDMA device ({devices}) "
            f"through UCX ({ver['UCX']}) {how} (mpi-ucx rows). On rxe devices, UCX up to 1.18 "
            "takes a RoCE UD packet's IP version from the completion's service level, which rxe "
            "leaves unset, so with an IPv4 GID it drops every UD packet, and UD is what wires up "
            f"RC; {DGID_CHECK}=n skips that check (fixed upstream in UCX 1.19, openucx/ucx PR "
            f"10209); {sets}. Each MPI case's RDMA device packet counters are read before and "
            "after it: an mpi-ucx case that moved no packet counts as failed (devices without "
            "such counters give no reading). mpi-tcp rows run Open MPI's ob1/TCP on the data NIC.")


def facts(env: Environment, results: Path) -> list[str]:
    """The run's facts, each read from environment.json ("unknown" where not recorded)."""
    def known(value: object) -> str:
        return text(value) or UNKNOWN
    status = "complete" if env.complete else "INCOMPLETE (interrupted or failed: partial results)"
    ver = versions(env)
    ran = how_nodes_ran(env)[0]
    out = [f"results: {results.name} ({status})", f"nodes: {known(env.nodes)}",
           f"nodes ran as: {ran}; accel: {known(env.accel)}, systemd-detect-virt: "
           f"{known(env.virtualization)}, image: {known(env.image)}",
           "versions: " + ", ".join(f"{k} {v}" for k, v in ver.items()),
           f"launcher: {launcher_fact(env)}",
           f"RoCE path MTU: {active_mtu(env) or UNKNOWN} (data NIC MTU {known(env.netdev_mtu)})"]
    devices = {k: t for k, v in env.rdma_devices.items() if (t := text(v))}
    netdevs = {k: t for k, v in env.netdevs.items() if (t := text(v))}
    if devices or netdevs:
        out.append("RDMA devices: " + (", ".join(f"{k} {v}" for k, v in devices.items()) or UNKNOWN)
                   + "; data NICs: " + (", ".join(f"{k} {v}" for k, v in netdevs.items()) or UNKNOWN))
    packages = env.packages
    if packages:
        out.append("packages: " + ", ".join(f"{k} {v}" for k, v in packages.items()))
    settings = env.ucx_settings
    out.append("UCX settings of mpi-ucx cases: " + (
        " ".join(f"{k}={v}" for k, v in settings.items()) if settings else UNKNOWN))
    out.append(gloo_fact(env))
    return out


def run_status(env: Environment, records: list[Record]) -> str:
    """The run's status as the header says it, agreeing with the INCOMPLETE banner and the
    findings: complete or not, then how many of its cases ended ok and how the others ended
    (a case not run, for a contender the nodes lack, is no failure). The rows' own status
    cannot say it: a case that failed left no row."""
    said, cases = ("complete", "cases") if env.complete else ("INCOMPLETE", "cases it recorded")
    ended = Counter(r.status for r in records)
    ok, skipped = ended.pop("ok", 0), ended.pop("skipped", 0)
    if not ended and not skipped and records:
        return f"{said}: all {ok} {cases} ok"
    others = [f"{n} {status}" for status, n in sorted(ended.items())]
    every = f"{len(records)} {cases}" if env.complete else f"the {len(records)} {cases}"
    return ", ".join([f"{said}: {ok} of {every} ok", *others,
                      *([f"{skipped} not run"] if skipped else [])])


LAUNCHED_BY = {"ssh": "ssh (our launcher, and mpirun, over SSH)",
               "srun": "srun (Slurm started every rank: srun, srun --mpi=pmix for MPI; "
                       "perftest pairs over SSH)"}


def launcher_fact(env: Environment) -> str:
    """How the ranks were started, as recorded."""
    said = text(env.launcher)
    if said is None:  # recorded since 2026-11-25; every run before started over SSH
        return LAUNCHED_BY["ssh"] + ", as every run before launchers were recorded"
    return LAUNCHED_BY.get(said, said)


def gloo_fact(env: Environment) -> str:
    """Whether the nodes could run the gloo contender (torch.distributed over Gloo): the torch
    each node reported, or which nodes had none."""
    hosts = env.hosts or {}
    if not any("torch" in h.model_fields_set for h in hosts.values()):
        return f"Gloo (torch.distributed): {UNKNOWN}"
    found = {name: text(h.torch) for name, h in hosts.items()}
    lacking = sorted(name for name, v in found.items() if v is None)
    if lacking:
        return (f"Gloo (torch.distributed): no torch on {', '.join(lacking)}: gloo cases were not "
                "run (a lab built with EXTRAS=torch has it)")
    return "Gloo (torch.distributed): torch " + ", ".join(sorted(set(filter(None, found.values())))) \
        + " on every node, over TCP"
