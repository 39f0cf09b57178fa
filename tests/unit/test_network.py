"""The data network's MTU: what each kind of segment carries and what rxe makes of it."""

import pytest

from infra import network, nocloud
from infra.config import DataNet, LabConfig
from infra.nocloud import KeyPair
from infra.status import parse_mtu


@pytest.mark.parametrize("mtu, ib", [(9000, 4096), (4192, 4096), (4191, 2048), (1500, 1024),
                                     (1280, 1024), (1119, 512)])
def test_rxe_path_mtu_follows_the_netdev_mtu(mtu, ib):
    assert network.rxe_path_mtu(mtu) == ib


def test_vde_cannot_carry_jumbo_frames_and_says_so():
    mtu, why = network.resolve_mtu(DataNet.VDE, 9000)
    assert mtu == 1500 and "vde_switch" in why and "DATA_NET=bridge" in why
    assert network.resolve_mtu(DataNet.BRIDGE, 9000) == (9000, "MTU: 9000 on the data network; "
                                                                "rxe path MTU 4096")


def test_network_config_sets_the_data_nic_mtu(tmp_path):
    config = LabConfig(mtu=9000, state_dir=tmp_path)
    key = KeyPair("private", "ssh-ed25519 AAAA test")
    files = nocloud.render(config, config.node(1), lab_key=key, cluster_key=key,
                        host_keys={n.name: key for n in config.all_nodes()}, instance_tag="t",
                        munge_key_b64="bXVuZ2U=")
    data0 = files["network-config"].split("data0:", 1)[1]
    assert "mtu: 9000" in data0


def test_status_shows_netdev_and_rdma_mtu():
    assert parse_mtu("4: ACTIVE\nhas-ip\nmtu data0 9000 4096\n") == "data0 9000 / rdma 4096"
    assert parse_mtu("missing\nno-ip\n") == "?"
