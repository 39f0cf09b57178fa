from infra import vm
from infra.config import Accel, DataNet, Image, LabConfig
from infra.images import BaseImage
from infra.state import LabState


def argv(tmp_path, image_kind=Image.DEBIAN12, data_net=DataNet.BRIDGE, monkeypatch=None):
    config = LabConfig(nodes=3, image=image_kind, data_net=data_net, state_dir=tmp_path)
    if image_kind is Image.DEBIAN12:
        image = BaseImage(Image.DEBIAN12, tmp_path / "d.raw", "raw", tmp_path / "k", tmp_path / "i")
    else:
        image = BaseImage(Image.UBUNTU, tmp_path / "u.img", "qcow2")
    return " ".join(vm.qemu_argv(config, LabState(tmp_path), image, Accel.TCG, config.node(2)))


def test_debian_node_boots_its_kernel_directly_with_a_locked_down_mgmt_nic(tmp_path, monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 0)
    a = argv(tmp_path)
    assert "-kernel" in a and "root=/dev/vda" in a
    assert "user,id=mgmt,restrict=on,net=10.0.3.0/24,hostfwd=tcp:127.0.0.1:2222-:22" in a
    assert "tap,id=data,ifname=rxelabt2,script=no" in a
    assert "mac=52:54:00:" in a and "-qmp unix:" in a and "-daemonize" in a
    assert "-serial file:" in a and "node2.serial.log" in a


def test_ubuntu_node_boots_from_its_disk_and_may_reach_its_package_mirror(tmp_path):
    a = argv(tmp_path, Image.UBUNTU, DataNet.VDE)
    assert "-kernel" not in a
    assert "restrict=off" in a
    assert "vde,id=data,sock=" in a



def test_the_kernel_boots_quietly_with_cloud_init_enabled_statically(tmp_path, monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 0)
    a = argv(tmp_path)
    assert "console=ttyS0 quiet " in a and " cloud-init=enabled" in a


def test_both_nics_go_without_virtios_event_index(tmp_path, monkeypatch):
    """With it, a node's transmit ring stalled for good under bulk RDMA writes (infra/network.py)."""
    monkeypatch.setattr("os.geteuid", lambda: 0)
    for data_net in (DataNet.BRIDGE, DataNet.VDE):
        nics = [w for w in argv(tmp_path, data_net=data_net).split() if w.startswith("virtio-net-pci")]
        assert sorted(n.split("netdev=")[1].split(",")[0] for n in nics) == ["data", "mgmt"]
        assert all("event_idx=off" in n.split(",") for n in nics), nics


def test_every_node_has_a_management_address_of_its_own(tmp_path):
    """Open MPI 5's runtime matches nodes by every address they have: one user-net address
    shared by all (qemu's 10.0.2.15) merged two nodes into one ("not enough slots")."""
    config = LabConfig(nodes=8, state_dir=tmp_path)
    nets = [n.mgmt_net for n in config.all_nodes()]
    assert len(set(nets)) == 8 and nets[0] == "10.0.2.0/24"
    assert all(not n.startswith("10.10.") for n in nets), "apart from the data network"
