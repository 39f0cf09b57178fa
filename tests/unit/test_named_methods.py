"""The named collectives (comm.alltoall, comm.iallreduce, ...) are the public API that type
checkers see, one line each onto collective()/start(): every shipped description has both
its methods, taking exactly the description's arguments and passing them on unchanged, so a
description changed without its methods fails here."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from rxelab import ops
from rxelab.comm import Communicator
from rxelab.comm.named import NamedCollectives

SHIPPED = [c for c in ops.COLLECTIVES.values()
           if all(where.startswith("rxelab.collectives.") for where in c.algorithms.values())]
DEFAULTS = {"algorithm": None, "compression": None, "pairs": 1, "root": ops.ROOT, "op": "sum"}


class Recorder(NamedCollectives):
    """The generic paths, recording what the named methods hand them."""

    def collective(self, name: str, sendbuf: Any, recvbuf: Any = None,
                   algorithm: str | None = None, **arguments: Any) -> Any:
        return "collective", name, sendbuf, recvbuf, algorithm, arguments

    def start(self, name: str, sendbuf: Any, recvbuf: Any = None, algorithm: str | None = None,
              **arguments: Any) -> Any:
        return "start", name, sendbuf, recvbuf, algorithm, arguments


def buffers(c: ops.Collective) -> list[str]:
    return ["buf"] if c.in_place else ["sendbuf", "recvbuf"]


def test_every_shipped_collective_is_here():
    assert {c.name for c in SHIPPED} >= {"alltoall", "allgather", "allreduce", "reduce_scatter",
                                         "bcast", "alltoallv"}


@pytest.mark.parametrize("c", SHIPPED, ids=lambda c: c.name)
@pytest.mark.parametrize("path, prefix", [("collective", ""), ("start", "i")])
def test_each_has_its_named_methods_with_its_description_s_arguments(c, path, prefix):
    method = getattr(Communicator, f"{prefix}{c.name}", None)
    assert method is not None, f"Communicator.{prefix}{c.name} is missing"
    params = inspect.signature(method).parameters
    assert set(params) - {"self"} == {*buffers(c), "algorithm", "compression", *c.takes}
    for name, default in DEFAULTS.items():
        if name in params:
            assert params[name].default == default, (c.name, name)
    for name in (*buffers(c), "send_counts", "recv_counts"):
        if name in params:
            assert params[name].default is inspect.Parameter.empty, (c.name, name)
    given = {name: object() for name in params if name != "self"}
    recorded = getattr(Recorder(), f"{prefix}{c.name}")(**given)
    send = given["buf" if c.in_place else "sendbuf"]
    assert recorded == (path, c.name, send, None if c.in_place else given["recvbuf"],
                        given["algorithm"],
                        {k: given[k] for k in (*c.takes, "compression")})
