"""Running something on every node is said once (`fleet.on_every_host`, issue 57), with one
failure behaviour: every node is tried to the end, and each node that failed is named. Before,
asking the nodes what they run and the deploy stopped at the first node's exception, which hid
the others and reached the user as that one exception."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest

from experiments.running import about, deploy, fleet
from experiments.running.deploy import NodeCheck
from infra.inventory import Host, Inventory, RdmaEndpoint, SSHEndpoint

HOSTS = [Host(f"node{i}", SSHEndpoint("127.0.0.1", 2220 + i), f"10.10.0.{10 + i}", RdmaEndpoint())
         for i in (1, 2, 3)]


def test_every_host_is_tried_to_the_end_when_one_fails_first():
    node1_failed = threading.Event()
    finished = []

    def work(h: Host) -> str:
        if h.name == "node1":
            node1_failed.set()
            raise ConnectionRefusedError("refused")
        assert node1_failed.wait(10), "node1 never ran"
        finished.append(h.name)
        return f"{h.name} ok"

    got = fleet.on_every_host(HOSTS, work)
    assert sorted(finished) == ["node2", "node3"]
    assert list(got) == ["node1", "node2", "node3"]
    assert isinstance(got["node1"], ConnectionRefusedError)
    assert got["node2"] == "node2 ok" and got["node3"] == "node3 ok"
    assert fleet.failed_hosts(got) == ["node1: refused"]


def test_a_failure_without_words_is_named_by_its_kind_and_a_long_one_by_its_first_line():
    def work(h: Host) -> None:
        if h.name == "node1":
            raise TimeoutError
        raise OSError("Command did not complete within 60 seconds!\n\nCommand: cat x\n\nStdout: ...")

    assert fleet.failed_hosts(fleet.on_every_host(HOSTS[:2], work)) == [
        "node1: TimeoutError", "node2: Command did not complete within 60 seconds!"]


def test_a_fault_of_ours_on_one_node_keeps_its_traceback_rather_than_a_node_failure():
    def work(h: Host) -> dict[str, str]:
        said: dict[str, str] = {}
        if h.name == "node2":
            return {"kernel": said["kernel"]}  # a bug of ours, not the node's
        raise ConnectionResetError("reset by peer")

    with pytest.raises(KeyError):
        fleet.failed_hosts(fleet.on_every_host(HOSTS, work))


def test_asking_the_nodes_names_every_node_that_did_not_answer(monkeypatch):
    asked = []

    class Answering:
        stdout = ""

        def run(self, *args, **kwargs):
            asked.append("node1")
            return self

    @contextmanager
    def connect(h: Host):
        if h.name == "node2":
            raise ConnectionRefusedError("connection refused")
        if h.name == "node3":
            raise TimeoutError("timed out")
        yield Answering()

    monkeypatch.setattr(about.fleet, "connect", connect)
    with pytest.raises(fleet.FleetError) as e:
        about.environment(HOSTS, None)
    assert asked == ["node1"]
    assert str(e.value).splitlines() == ["could not ask the nodes what they run:",
                                         "  node2: connection refused", "  node3: timed out"]
    assert isinstance(e.value.__cause__, OSError), "fab --debug shows what the node did"


def test_a_deploy_that_loses_one_node_names_it_and_tries_every_node(monkeypatch):
    tried = []

    def deploy_one(h: Host, data: bytes, digest: str, say) -> NodeCheck:
        tried.append(h.name)
        if h.name == "node2":
            raise ConnectionResetError("reset by peer")
        return NodeCheck(h.name, True, ())

    monkeypatch.setattr(deploy, "bundle", lambda: (b"", "0" * 64))
    monkeypatch.setattr(deploy, "deploy_one", deploy_one)
    with pytest.raises(fleet.FleetError) as e:
        deploy.deploy(Inventory("t", tuple(HOSTS)))
    assert sorted(tried) == ["node1", "node2", "node3"]
    assert str(e.value).splitlines() == ["some nodes cannot run the experiments:",
                                         "  node2: reset by peer"]


def test_a_bug_in_a_deploy_is_raised_as_it_was(monkeypatch):
    def deploy_one(h: Host, data: bytes, digest: str, say) -> NodeCheck:
        raise TypeError("a bug of ours")

    monkeypatch.setattr(deploy, "bundle", lambda: (b"", "0" * 64))
    monkeypatch.setattr(deploy, "deploy_one", deploy_one)
    with pytest.raises(TypeError, match="a bug of ours"):
        deploy.deploy(Inventory("t", tuple(HOSTS)))
