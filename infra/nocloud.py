"""cloud-init's NoCloud data (its "seed"; here the NoCloud ISO, since "the seed" in this
project is the original C code whose API rxelab.seed_api keeps): one user-data template for
both images, rendered with Jinja2, packed per node into an ISO labelled `cidata` (pycdlib, so
no genisoimage is needed).

Keys are made per lab, never committed: the lab key (host -> nodes), the cluster key
(node -> node, for mpirun) and one SSH host key per node, pinned in the lab's known_hosts so
nobody has to turn host-key checking off. The seeds carry the cluster and host private keys,
so they are 0600 in the lab's 0700 directory, as are the overlays. Pushing the cluster key
over SSH after boot instead would protect nothing more: the node's disk (its overlay, beside
the seed) holds the key from first boot on, and both are readable only by the lab's owner,
who holds the lab key anyway.
"""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass
from pathlib import Path

import jinja2

from infra import run as runner
from infra.config import DATA_NIC, MGMT_NIC, REPO, VM_USER, Image, LabConfig, Node
from infra.images import UBUNTU_PACKAGES, extra_packages
from infra.state import LabState, mkdir_private, write_atomic
from infra.units import nic_name_link, rdma_device_files

TEMPLATES = REPO / "cloud-init"
SLURM_CPUS = 4  # ranks Slurm may place on a node (each VM has one vCPU; they share it)


@dataclass(frozen=True)
class KeyPair:
    private: str
    public: str


def ensure_key(path: Path, comment: str) -> KeyPair:
    if not path.exists():
        mkdir_private(path.parent)
        runner.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])
    return KeyPair(path.read_text(), path.with_suffix(".pub").read_text().strip())


def ensure_munge_key(path: Path) -> str:
    """The lab's own MUNGE key (1 KiB of randomness), base64: made once, 0600 like every key."""
    if not path.exists():
        write_atomic(path, base64.b64encode(os.urandom(1024)).decode() + "\n")
    return path.read_text().strip()


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


@dataclass(frozen=True)
class NodeView:
    """What a template may know about a peer node."""

    name: str
    data_ip: str
    host_key_public: str


def render(
    config: LabConfig,
    node: Node,
    *,
    lab_key: KeyPair,
    cluster_key: KeyPair,
    host_keys: dict[str, KeyPair],
    instance_tag: str,
    munge_key_b64: str,
) -> dict[str, str]:
    """The three NoCloud files for one node, as text."""
    ubuntu = config.image is Image.UBUNTU
    context = {
        "lab": config.lab,
        "image": config.image.value,
        "node": node,
        "nodes": [NodeView(n.name, n.data_ip, host_keys[n.name].public) for n in config.all_nodes()],
        "prefixlen": config.prefixlen,
        "mtu": config.mtu,
        "user": VM_USER,
        "data_nic": DATA_NIC,
        "mgmt_nic": MGMT_NIC,
        "rdma_files": rdma_device_files(),
        "nic_links": [nic_name_link(MGMT_NIC, node.mgmt_mac), nic_name_link(DATA_NIC, node.data_mac)],
        # Debian's image is built here with the unit baked in; Ubuntu's is not ours to build.
        "baked": not ubuntu,
        "host_key": host_keys[node.name],
        "lab_key": lab_key,
        "cluster_key": cluster_key,
        "packages": UBUNTU_PACKAGES + extra_packages(config.extras) if ubuntu else [],
        "instance_tag": instance_tag,
        "munge_key_b64": munge_key_b64,
        "controller": config.all_nodes()[0].name,
    }
    env = _env()
    context["slurm_conf"] = env.get_template("slurm.conf.j2").render(
        lab=config.lab, controller=config.all_nodes()[0], nodes=config.all_nodes(),
        cpus=SLURM_CPUS)
    return {
        name: env.get_template(f"{name}.yaml.j2").render(context)
        for name in ("user-data", "network-config", "meta-data")
    }


def write_iso(files: dict[str, str], dest: Path) -> None:
    import pycdlib

    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident="cidata")
    for name, text in files.items():
        data = text.encode()
        iso.add_fp(io.BytesIO(data), len(data), "/" + name.upper().replace("-", "_") + ".;1",
                   rr_name=name, joliet_path="/" + name)
    mkdir_private(dest.parent)
    tmp = dest.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    # the ISO carries private keys: 0600 from its first byte, also if we crash while writing
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        iso.write_fp(f)
    iso.close()
    tmp.replace(dest)


def make_isos(config: LabConfig, state: LabState, instance_tag: str) -> None:
    """Keys, rendered files (kept next to the ISO for reading) and ISOs for every node."""
    lab_key = ensure_key(state.ssh_key, f"{config.lab}-lab")
    cluster_key = ensure_key(state.cluster_key, f"{config.lab}-cluster")
    host_keys = {n.name: ensure_key(state.host_key(n.name), n.name) for n in config.all_nodes()}
    munge_key = ensure_munge_key(state.munge_key)
    known = "".join(
        f"[127.0.0.1]:{n.ssh_port} {host_keys[n.name].public}\n" for n in config.all_nodes()
    )
    write_atomic(state.known_hosts, known)
    for node in config.all_nodes():
        files = render(config, node, lab_key=lab_key, cluster_key=cluster_key,
                       host_keys=host_keys, instance_tag=instance_tag, munge_key_b64=munge_key)
        rendered = state.seeds / node.name
        mkdir_private(rendered)
        for name, text in files.items():
            write_atomic(rendered / name, text, mode=0o600)
        write_iso(files, state.seed_iso(node.name))
