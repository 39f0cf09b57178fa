import json

import pytest

from infra import inventory
from infra.config import LabConfig
from infra.errors import LabError
from infra.state import LabState


def lab_inventory(tmp_path, nodes=3):
    config = LabConfig(nodes=nodes, state_dir=tmp_path)
    return inventory.for_lab(config, LabState(tmp_path))


def test_lab_inventory_round_trips_through_the_file(tmp_path):
    inv = lab_inventory(tmp_path)
    path = tmp_path / "inventory.json"
    inventory.save(inv, path)
    again = inventory.load(path)
    assert again == inv
    node2 = again.host("node2")
    assert (node2.ssh.host, node2.ssh.port, node2.data_ip) == ("127.0.0.1", 2222, "10.10.0.12")
    assert (node2.rdma.device, node2.rdma.gid_index) == ("rxe0", 1)


def test_existing_hosts_need_only_name_host_and_data_ip():
    inv = inventory.parse({"version": 1, "nodes": [
        {"name": "gpu-a", "ssh": {"host": "gpu-a.example"}, "data_ip": "192.0.2.1",
         "rdma": {"device": "mlx5_0", "gid_index": 3}},
        {"name": "gpu-b", "ssh": {"host": "gpu-b.example", "user": "me"}, "data_ip": "192.0.2.2"},
    ]})
    a, b = inv.hosts
    assert (a.ssh.port, a.rdma.device, a.rdma.gid_index) == (22, "mlx5_0", 3)
    assert (b.ssh.user, b.rdma.device) == ("me", "rxe0")


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (lambda d: d.update(version=2), "reads version 1"),
        (lambda d: d.update(nodes=[]), "nodes: must be a non-empty list"),
        (lambda d: d["nodes"][0].update(colour="red"), "nodes[0]: unknown key 'colour'"),
        (lambda d: d["nodes"][0].pop("data_ip"), "nodes[0]: missing key 'data_ip'"),
        (lambda d: d["nodes"][0]["ssh"].update(port=70000), "nodes[0].ssh.port"),
        (lambda d: d["nodes"][0]["ssh"].update(port=True), "nodes[0].ssh.port"),
        (lambda d: d["nodes"][1].update(data_ip="10.10.0.999"), "is not an IP address"),
        (lambda d: d["nodes"][1].update(name="node1"), "name 'node1' is used more than once"),
        (lambda d: d["nodes"][1]["ssh"].update(port=2221), "127.0.0.1:2221 is used more than once"),
        (lambda d: d["nodes"][0].update(name="bad name"), "is not a valid name"),
        (lambda d: d["nodes"][0]["rdma"].update(gid_index=-1), "nodes[0].rdma.gid_index"),
    ],
)
def test_invalid_inventories_name_the_problem(tmp_path, mutate, problem):
    doc = json.loads(lab_inventory(tmp_path).to_json())
    mutate(doc)
    with pytest.raises(LabError) as e:
        inventory.parse(doc, source="inv.json")
    assert "inv.json is not a valid inventory" in str(e.value)
    assert problem in str(e.value)


def test_missing_and_malformed_files_are_clear_errors(tmp_path):
    with pytest.raises(LabError, match="no inventory at"):
        inventory.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(LabError, match="not valid JSON"):
        inventory.load(bad)


def test_unknown_node_lists_the_known_ones(tmp_path):
    with pytest.raises(LabError) as e:
        lab_inventory(tmp_path).host("node7")
    assert "node1, node2, node3" in str(e.value)


# ---- issue 15, item 4: nothing in an inventory becomes an option or a command --------------
@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d["nodes"][0]["ssh"].update(user="-oProxyCommand=touch x"), "nodes[0].ssh.user"),
        (lambda d: d["nodes"][0]["ssh"].update(user="lab x"), "nodes[0].ssh.user"),
        (lambda d: d["nodes"][0]["ssh"].update(host="-oProxyCommand=touch x"), "nodes[0].ssh.host"),
        (lambda d: d["nodes"][0]["ssh"].update(host="a.example;id"), "nodes[0].ssh.host"),
        (lambda d: d["nodes"][0]["ssh"].update(host="a:b"), "nodes[0].ssh.host"),
        (lambda d: d["nodes"][0]["ssh"].update(host="10.0.0.1:2222"), "nodes[0].ssh.host"),
        (lambda d: d["nodes"][0]["ssh"].update(host=":"), "nodes[0].ssh.host"),
        (lambda d: d["nodes"][0]["ssh"].update(key="-i/etc/passwd"), "nodes[0].ssh.key"),
        (lambda d: d["nodes"][0]["ssh"].update(known_hosts="/tmp/a /tmp/b"), "nodes[0].ssh.known_hosts"),
        (lambda d: d["nodes"][0]["ssh"].update(known_hosts="/tmp/%d"), "nodes[0].ssh.known_hosts"),
        (lambda d: d["nodes"][0]["rdma"].update(device="rxe0; touch x"), "nodes[0].rdma.device"),
        (lambda d: d["nodes"][0]["rdma"].update(device="../../etc"), "nodes[0].rdma.device"),
        (lambda d: d["nodes"][0]["rdma"].update(device="$(id)"), "nodes[0].rdma.device"),
        (lambda d: d["nodes"][0].update(data_ip="fe80::1%x;id"), "nodes[0].data_ip"),
        (lambda d: d["nodes"][0].update(data_ip=" 10.0.0.1"), "nodes[0].data_ip"),
        (lambda d: d["nodes"][0]["ssh"].update(port="22"), "nodes[0].ssh.port"),
        (lambda d: d["nodes"][0]["rdma"].update(port=1.0), "nodes[0].rdma.port"),
        (lambda d: d.update(lab="x/../y"), "lab"),
        (lambda d: d.update(nodes={"a": 1}), "nodes"),
    ],
)
def test_values_that_could_reach_a_shell_or_ssh_options_are_refused(tmp_path, mutate, where):
    doc = json.loads(lab_inventory(tmp_path).to_json())
    mutate(doc)
    with pytest.raises(LabError) as e:
        inventory.parse(doc, source="inv.json")
    assert f"\n  {where}:" in str(e.value), str(e.value)


def test_a_host_cannot_be_made_with_a_bad_value_in_code_either():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        inventory.Host("a", inventory.SSHEndpoint("h"), "10.0.0.1", inventory.RdmaEndpoint("rxe0;id"))


def test_real_hosts_names_and_devices_still_pass():
    inv = inventory.parse({"version": 1, "lab": "gpu.cluster-2", "nodes": [
        {"name": "gpu-a.rack_1", "ssh": {"host": "gpu-a.example.org", "user": "first.last",
                                          "key": "~/.ssh/id_ed25519",
                                          "known_hosts": "/etc/ssh/ssh_known_hosts"},
         "data_ip": "192.0.2.1", "rdma": {"device": "mlx5_0", "port": 1, "gid_index": 3}},
        {"name": "b", "ssh": {"host": "2001:db8::2", "port": 2222}, "data_ip": "2001:db8::12",
         "rdma": {"device": "irdma-eth1"}},
    ]})
    assert [h.rdma.device for h in inv.hosts] == ["mlx5_0", "irdma-eth1"]


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"\x00\x01\x02\xff\xfe binary", "not UTF-8 text"),
        ('{"version": 1}'.encode("utf-16"), "not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"version": 1, "nodes": [{"name": "a", "ssh": {"host": "h", "port": ' + b"9" * 5000
         + b'}, "data_ip": "10.0.0.1"}]}', "a number too large"),
        (b" " * (2 << 20), "larger than 1 MiB"),
    ],
)
def test_any_file_is_one_clear_error(tmp_path, content, problem):
    path = tmp_path / "inv.json"
    path.write_bytes(content)
    with pytest.raises(LabError, match=problem):
        inventory.load(path)


def test_a_directory_or_unreadable_file_is_a_clear_error(tmp_path):
    with pytest.raises(LabError, match="is a directory"):
        inventory.load(tmp_path)


def test_make_status_refuses_an_injected_inventory(tmp_path):
    """`make status` used to show such an inventory and run its values through ssh."""
    import subprocess
    import sys

    from infra.config import REPO

    doc = json.loads(lab_inventory(tmp_path).to_json())
    doc["nodes"][0]["ssh"]["user"] = f"-oProxyCommand=touch {tmp_path}/pwned"
    doc["nodes"][1]["rdma"]["device"] = f"rxe0; touch {tmp_path}/pwned2"
    inv = tmp_path / "evil.json"
    inv.write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, "-m", "infra", "status", "--inventory", str(inv)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "is not a valid inventory" in r.stderr
    assert "nodes[0].ssh.user" in r.stderr and "nodes[1].rdma.device" in r.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
