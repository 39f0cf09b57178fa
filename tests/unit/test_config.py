import pytest

from infra.config import Accel, DataNet, Image, LabConfig
from infra.errors import LabError


def test_defaults_are_three_nodes_auto_everything(tmp_path):
    c = LabConfig(state_dir=tmp_path)
    assert (c.nodes, c.image, c.accel, c.data_net) == (3, Image.AUTO, Accel.AUTO, DataNet.AUTO)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nodes": "1"}, "NODES=1 is out of range"),
        ({"nodes": "9"}, "NODES=9 is out of range"),
        ({"nodes": "three"}, "NODES='three' is not a whole number"),
        ({"image": "fedora"}, "unknown IMAGE 'fedora'"),
        ({"accel": "hvf"}, "unknown ACCEL 'hvf'"),
        ({"mem_mb": "64"}, "MEM_MB=64 is out of range"),
        ({"data_net": "wifi"}, "unknown DATA_NET 'wifi'"),
    ],
)
def test_bad_input_gives_one_clear_message(tmp_path, kwargs, message):
    with pytest.raises(LabError) as e:
        LabConfig.from_strings(state_dir=tmp_path, **kwargs)
    assert message in str(e.value)
    assert e.value.hint, "every input error tells what to use instead"


def test_bad_lab_name_is_refused(tmp_path):
    with pytest.raises(LabError, match="lab name"):
        LabConfig(lab="My Lab!", state_dir=tmp_path)


def test_nodes_get_distinct_ports_ips_macs_and_short_tap_names(tmp_path):
    c = LabConfig(nodes=8, state_dir=tmp_path)
    nodes = c.all_nodes()
    for attr in ("name", "ssh_port", "data_ip", "mgmt_mac", "data_mac", "tap"):
        values = [getattr(n, attr) for n in nodes]
        assert len(set(values)) == 8, attr
    assert all(len(n.tap) <= 15 for n in nodes), "IFNAMSIZ"
    assert nodes[0].data_ip == "10.10.0.11" and nodes[0].ssh_port == 2221


def test_two_labs_never_share_mac_addresses(tmp_path):
    a = LabConfig(lab="alpha", state_dir=tmp_path).node(1)
    b = LabConfig(lab="beta", state_dir=tmp_path).node(1)
    assert a.data_mac != b.data_mac and a.tap != b.tap


def test_node_index_outside_the_lab_is_an_error(tmp_path):
    with pytest.raises(LabError, match="outside 1..3"):
        LabConfig(state_dir=tmp_path).node(4)


def test_json_round_trip(tmp_path):
    c = LabConfig(nodes=4, image=Image.DEBIAN12, accel=Accel.TCG, mem_mb=768, state_dir=tmp_path)
    assert LabConfig.from_json(c.to_json()) == c
