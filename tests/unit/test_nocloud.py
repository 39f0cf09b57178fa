import base64

import pytest
import yaml

from infra import debian_image, images, nocloud, units
from infra.config import Image, LabConfig
from infra.state import LabState


def keys():
    kp = lambda n: nocloud.KeyPair(f"-----BEGIN KEY-----\n{n}\n-----END KEY-----\n",  # noqa: E731
                                f"ssh-ed25519 AAAA{n} {n}")
    return {"lab_key": kp("lab"), "cluster_key": kp("cluster"),
            "host_keys": {f"node{i}": kp(f"host{i}") for i in range(1, 5)},
            "munge_key_b64": "bXVuZ2U="}


@pytest.mark.parametrize("image", [Image.DEBIAN12, Image.UBUNTU])
def test_user_data_is_valid_cloud_config_for_both_images(tmp_path, image):
    config = LabConfig(nodes=3, image=image, state_dir=tmp_path)
    files = nocloud.render(config, config.node(2), instance_tag="t", **keys())
    text = files["user-data"]
    assert text.startswith("#cloud-config\n")
    ud = yaml.safe_load(text)
    assert ud["hostname"] == "node2"
    (user,) = ud["users"]
    assert user["name"] == "lab" and user["name"] != "rdma"
    assert user["ssh_authorized_keys"] == ["ssh-ed25519 AAAAlab lab", "ssh-ed25519 AAAAcluster cluster"]
    assert ud["ssh_keys"]["ed25519_private"].startswith("-----BEGIN KEY-----\nhost2\n")
    files_by_path = {f["path"]: f for f in ud["write_files"]}
    hosts = files_by_path["/etc/hosts"]["content"]
    assert "10.10.0.11 node1\n" in hosts and "10.10.0.13 node3\n" in hosts
    known = files_by_path["/etc/ssh/ssh_known_hosts"]["content"]
    assert "node3,10.10.0.13 ssh-ed25519 AAAAhost3 host3" in known
    private = files_by_path["/home/lab/.ssh/id_ed25519"]
    assert private["permissions"] == "0600" and private["defer"] is True
    if image is Image.UBUNTU:
        assert "python3-pyverbs" in ud["packages"] and "perftest" in ud["packages"]
        assert any("linux-modules-extra-$(uname -r)" in " ".join(c) for c in ud["runcmd"])
        for f in units.rdma_device_files():
            assert files_by_path[str(f.path)]["content"] == f.text, "the one template, by cloud-init"
        assert ["udevadm", "trigger", "--action=add", "--sysname-match=data0"] in ud["runcmd"]
    else:
        assert "packages" not in ud, "Debian's image has its packages baked in"
        assert "runcmd" not in ud and "/etc/systemd/system/rxe0.service" not in files_by_path, (
            "Debian's image has the rxe unit baked in: nothing to run at boot")
    node = config.node(2)
    for nic, mac in (("mgmt0", node.mgmt_mac), ("data0", node.data_mac)):
        link = files_by_path[f"/etc/systemd/network/10-rxelab-{nic}.link"]["content"]
        assert f"MACAddress={mac}\n" in link and f"Name={nic}\n" in link, link


def test_the_rxe_unit_is_started_by_its_nic_appearing_not_by_a_target_with_a_timeout():
    """A start job from a target waits for the NIC on systemd's device timeout (90 s) and is
    never retried: on a busy host the NIC came minutes late and rxe0 never came up."""
    unit, rule = units.rdma_device_files()
    assert str(unit.path) == "/etc/systemd/system/rxe0.service"
    assert "rdma link add rxe0 type rxe netdev data0" in unit.text
    assert "[Install]" not in unit.text and "WantedBy" not in unit.text
    assert "BindsTo=sys-subsystem-net-devices-data0.device" in unit.text
    deps = [line for line in unit.text.splitlines() if line.startswith(("After=", "Wants=", "Requires="))]
    assert deps and not any("network-online" in line for line in deps), deps
    assert str(rule.path).startswith("/etc/udev/rules.d/") and rule.name.endswith(".rules")
    rules = [ln for ln in rule.text.splitlines() if ln and not ln.startswith("#")]
    # named at its add (a .link file), or renamed later (cloud-init's first boot): both pull it in
    assert any('ACTION=="add"' in ln and 'NAME=="data0"' in ln for ln in rules), rules
    assert any('ACTION=="move"' in ln and 'KERNEL=="data0"' in ln for ln in rules), rules
    for ln in rules:
        assert 'TAG+="systemd"' in ln and 'ENV{SYSTEMD_WANTS}+="rxe0.service"' in ln, ln


def test_the_debian_recipe_key_follows_the_rxe_unit_and_rule(monkeypatch):
    before = images.debian_recipe_key()
    unit, rule = units.rdma_device_files()
    for changed in ((units.GuestFile(unit.path, "[Unit]\n"), rule),
                    (unit, units.GuestFile(rule.path, "# nothing\n"))):
        monkeypatch.setattr(debian_image, "rdma_device_files", lambda c=changed: c)
        assert images.debian_recipe_key() != before, "a changed unit or rule builds a new image"


def test_network_config_matches_nics_by_mac(tmp_path):
    config = LabConfig(nodes=3, state_dir=tmp_path)
    node = config.node(3)
    nc = yaml.safe_load(nocloud.render(config, node, instance_tag="t", **keys())["network-config"])
    assert nc["version"] == 2
    assert nc["ethernets"]["mgmt0"]["match"]["macaddress"] == node.mgmt_mac
    assert nc["ethernets"]["mgmt0"]["dhcp4"] is True
    data = nc["ethernets"]["data0"]
    assert data["match"]["macaddress"] == node.data_mac and data["set-name"] == "data0"
    assert data["addresses"] == ["10.10.0.13/24"]


def test_meta_data_has_a_per_node_instance_id(tmp_path):
    config = LabConfig(nodes=2, state_dir=tmp_path)
    md = [yaml.safe_load(nocloud.render(config, n, instance_tag="42", **keys())["meta-data"])
          for n in config.all_nodes()]
    assert md[0]["instance-id"] != md[1]["instance-id"]
    assert md[1]["local-hostname"] == "node2"


def test_make_isos_writes_keys_known_hosts_and_cidata_isos(tmp_path):
    import pycdlib

    config = LabConfig(nodes=2, image=Image.DEBIAN12, state_dir=tmp_path)
    state = LabState(tmp_path)
    nocloud.make_isos(config, state, instance_tag="1")
    assert (state.ssh_key.stat().st_mode & 0o777) == 0o600
    known = state.known_hosts.read_text().splitlines()
    assert known[1].startswith("[127.0.0.1]:2222 ssh-ed25519 ")
    iso = pycdlib.PyCdlib()
    iso.open(str(state.seed_iso("node1")))
    try:
        assert iso.pvd.volume_identifier.decode().strip() == "cidata"
        names = {c.file_identifier().decode("utf-16-be") for c in iso.list_children(joliet_path="/")}
        assert {"user-data", "meta-data", "network-config"} <= names
    finally:
        iso.close()
    first_key = state.ssh_key.read_text()
    nocloud.make_isos(config, state, instance_tag="2")
    assert state.ssh_key.read_text() == first_key, "keys are made once per lab"


def test_extras_reach_ubuntu_by_cloud_init_and_debian_by_its_image(tmp_path):
    from infra.config import Extras
    for image, installs in ((Image.UBUNTU, True), (Image.DEBIAN12, False)):
        config = LabConfig(nodes=3, image=image, extras=Extras.TORCH, state_dir=tmp_path)
        ud = yaml.safe_load(nocloud.render(config, config.node(1), instance_tag="t", **keys())["user-data"])
        assert ("python3-torch" in ud.get("packages", [])) is installs


def test_a_lab_recorded_before_extras_reads_as_none(tmp_path):
    import json

    from infra.config import Extras
    data = json.loads(LabConfig(state_dir=tmp_path).to_json())
    del data["extras"]
    assert LabConfig.from_json(json.dumps(data)).extras is Extras.NONE
    with pytest.raises(ValueError):
        LabConfig.from_json(json.dumps({**data, "extras": "tensorflow"}))


def test_every_node_gets_the_labs_slurm_and_only_the_first_runs_its_controller(tmp_path):
    config = LabConfig(nodes=3, state_dir=tmp_path)
    seen = {}
    for node in config.all_nodes():
        ud = yaml.safe_load(nocloud.render(config, node, instance_tag="t", **keys())["user-data"])
        files = {f["path"]: f for f in ud["write_files"]}
        key = files["/etc/munge/munge.key"]
        assert key["owner"] == "munge:munge" and key["permissions"] == "0400"
        assert key["encoding"] == "b64" and key["content"] == "bXVuZ2U=" and key["defer"] is True
        conf = files["/etc/slurm/slurm.conf"]["content"]
        assert "SlurmctldHost=node1(10.10.0.11)" in conf and "AuthType=auth/munge" in conf
        for n in config.all_nodes():
            assert f"NodeName={n.name} NodeAddr={n.data_ip} CPUs={nocloud.SLURM_CPUS}" in conf
        seen[node.name] = "/etc/slurm/rxelab-controller" in files
    assert seen == {"node1": True, "node2": False, "node3": False}


def test_each_lab_has_a_munge_key_of_its_own_private_to_its_owner(tmp_path):
    keys_of = []
    for lab in ("a", "b"):
        state = LabState(tmp_path / lab)
        key = nocloud.ensure_munge_key(state.munge_key)
        assert len(base64.b64decode(key)) == 1024
        assert state.munge_key.stat().st_mode & 0o777 == 0o600
        assert nocloud.ensure_munge_key(state.munge_key) == key, "made once per lab"
        keys_of.append(key)
    assert keys_of[0] != keys_of[1]
