"""The RDMA device, port and GID index can be chosen (issue 59): on a node with a management
HCA beside its data HCAs, the first ACTIVE port is the wrong one. init()'s device=, port=,
gid_index= choose them, else RXELAB_DEVICE, RXELAB_IB_PORT, RXELAB_GID_INDEX (an argument wins);
what cannot be used is said in words: the devices there are, the port's state, the size of the
GID table. On the fake fabric, whose devices a test sets (pyverbs._fabric.DEVICES)."""

import pytest
from pyverbs import _fabric
from pyverbs import enums as e
from rxelab import settings, transports, verbs
from rxelab.errors import ConfigError
from rxelab.transports import verbs_port

from tests.unit.fakejob import run_ranks

UP, DOWN, INIT = e.IBV_PORT_ACTIVE, e.IBV_PORT_DOWN, e.IBV_PORT_INIT
ENVS = (settings.DEVICE_ENV, settings.IB_PORT_ENV, settings.GID_INDEX_ENV)


@pytest.fixture
def node(monkeypatch):
    """A management HCA (one ACTIVE port) listed before a data HCA (port 1 DOWN, 2 ACTIVE)."""
    monkeypatch.setattr(_fabric, "DEVICES", {"mgmt0": (UP,), "data0": (DOWN, UP)})
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)


def opened(name=None, port=None, gid_index=None):
    dev = verbs.Device(name, port, gid_index)
    try:
        return dev.name, dev.port, dev.gid_index
    finally:
        dev.close()


def test_without_a_choice_the_first_active_port_is_taken(node):
    assert opened() == ("mgmt0", 1, 1)


def test_a_device_port_and_gid_index_are_chosen(node):
    assert opened("data0") == ("data0", 2, 1), "the named device's first ACTIVE port"
    assert opened(port=2) == ("data0", 2, 1), "the first device whose port 2 is ACTIVE"
    assert opened("data0", 2, 0) == ("data0", 2, 0)


@pytest.mark.parametrize("choice, said", [
    (("nope", None, None), "no RDMA device named 'nope' (hint: devices: mgmt0, data0)"),
    (("data0", 1, None), "port 1 of RDMA device data0 is DOWN, not ACTIVE"),
    (("data0", 3, None), "RDMA device data0 has no port 3 (hint: its ports: 1..2)"),
    ((None, 3, None), "no RDMA device has an ACTIVE port 3 (hint: mgmt0 has no port 3; data0 "
                      "has no port 3; `rdma link` shows each port's state"),
    (("mgmt0", None, 4), "GID index 4 is out of range: mgmt0 port 1 has a GID table of 4 "
                         "entries (0..3)"),
    (("mgmt0", None, 2), "GID index 2 of mgmt0 port 1 is empty"),
])
def test_what_cannot_be_used_is_said_in_words(node, choice, said):
    with pytest.raises(ConfigError) as err:
        opened(*choice)
    assert said in str(err.value)


def test_no_active_port_anywhere_says_each_ports_state(monkeypatch):
    monkeypatch.setattr(_fabric, "DEVICES", {"mgmt0": (DOWN,), "data0": (DOWN, INIT)})
    with pytest.raises(ConfigError, match=r"^no RDMA device has an ACTIVE port \(hint: mgmt0: "
                                          r"port 1 DOWN; data0: port 1 DOWN, port 2 INIT; "
                                          r"`rdma link` shows each port's state; an rxe port is "
                                          r"ACTIVE once its netdev is up \(`sudo ip link set "
                                          r"<if> up`\)\)$"):
        opened()
    with pytest.raises(ConfigError, match=r"^RDMA device data0 has no ACTIVE port"):
        opened("data0")


def test_init_reads_the_environment_and_an_argument_wins(node, monkeypatch):
    def where(comm):
        return comm.dev.name, comm.dev.port, comm.dev.gid_index

    monkeypatch.setenv(settings.DEVICE_ENV, "data0")
    monkeypatch.setenv(settings.IB_PORT_ENV, "2")
    monkeypatch.setenv(settings.GID_INDEX_ENV, "0")
    assert run_ranks(2, where, device=None) == [("data0", 2, 0)] * 2
    assert run_ranks(2, where, device="mgmt0", port=1) == [("mgmt0", 1, 0)] * 2
    assert run_ranks(2, where, device=None, gid_index=1) == [("data0", 2, 1)] * 2


@pytest.mark.parametrize("env, given, said", [
    ({settings.IB_PORT_ENV: "x"}, {}, "RXELAB_IB_PORT='x': the RDMA device's port, a whole number "
                                      "from 1 to 255"),
    ({settings.IB_PORT_ENV: "0"}, {}, "RXELAB_IB_PORT='0'"),
    ({settings.GID_INDEX_ENV: "-1"}, {}, "RXELAB_GID_INDEX='-1': the port's GID table index"),
    ({settings.GID_INDEX_ENV: "256"}, {}, "RXELAB_GID_INDEX='256': the port's GID table index, "
                                          "a whole number from 0 to 255"),
    ({}, {"port": 0}, "port=0: the RDMA device's port"),
    ({}, {"port": True}, "port=True"),
    ({}, {"gid_index": "1"}, "gid_index='1': the port's GID table index"),
    ({}, {"device": ""}, "device='' must name an RDMA device (verbs) or an address"),
])
def test_a_wrong_choice_is_named_as_it_was_given(env, given, said):
    with pytest.raises(ConfigError) as err:
        transports.where("verbs", env=env, **given)
    assert str(err.value).startswith(said)


def test_an_rdma_port_in_the_environment_is_refused_for_tcp_by_its_name():
    with pytest.raises(ConfigError, match=r"^RXELAB_GID_INDEX='1' chooses an RDMA port; "
                                          r"transport tcp has none"):
        transports.where("tcp", env={settings.GID_INDEX_ENV: "1"})
    assert transports.where("tcp", env={settings.DEVICE_ENV: "127.0.0.1"}).device == "127.0.0.1"
    assert transports.where("verbs", "rxe0", env={settings.DEVICE_ENV: "mlx5_0"}).device == "rxe0"


def test_the_choice_is_a_pure_function_of_the_ports_states():
    assert verbs_port.first_active([DOWN, UP, UP], None) == 2
    assert verbs_port.first_active([DOWN, UP], 1) is None
    assert verbs_port.first_active([UP], 2) is None
    assert verbs_port.state_name(9) == "in state 9"
