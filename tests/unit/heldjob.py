"""tests/unit/fakejob.run_ranks without its race: rank 0's rendezvous is bound (port 0) before
any rank starts and handed to rank 0, so no port is picked, let go and taken again (by another
test's job, or another user's process, in between)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import rxelab
from pyverbs import _fabric
from rxelab.control import addresses

from tests.unit.fakejob import in_threads


def run_held(p: int, fn: Callable[[Any], Any], deadline: float, keep_errors: bool = True,
             **options: Any) -> list[Any]:
    """Each rank's fn(comm) (or, keep_errors, its exception) in a job of p elastic ranks,
    threads on the fake fabric with the real control plane on 127.0.0.1 (options: init()'s;
    timeout 20 s unless given)."""
    rendezvous = addresses.any_address(0)
    port = rendezvous.getsockname()[1]
    _fabric.FABRIC.reset(seed=0, max_delay=0.0002)

    def rank(r: int) -> Any:
        held = {"_listener": rendezvous} if r == 0 else {}
        with rxelab.init(r, p, "127.0.0.1", port, device="fake0",
                         **{"timeout": 20, "elastic": True, **options}, **held) as comm:
            return fn(comm)
    try:
        return in_threads(p, rank, deadline, keep_errors)
    finally:
        rendezvous.close()  # rank 0's control plane closed it already, unless it never began
