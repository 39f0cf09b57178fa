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
    with pytest.raises(LabError, match="is not valid JSON"):
        inventory.load(bad)


def test_unknown_node_lists_the_known_ones(tmp_path):
    with pytest.raises(LabError) as e:
        lab_inventory(tmp_path).host("node7")
    assert "node1, node2, node3" in str(e.value)
