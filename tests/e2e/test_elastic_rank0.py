"""Elastic training survives rank 0 on the lab (issue 27, item 8): 6 ranks on 3 nodes, 2 per
node, started by our launcher with the lab's host names (MASTER_ADDR=node1, which node1
itself resolves to 127.0.1.1 first). Before, killing rank 0 left its live node-mate out (its
listener sat on loopback, where no other node could ask it), and killing rank 0 with another
rank in the same step ended the job. Every survivor must finish, with the same parameters."""

from __future__ import annotations

import pytest

from tests.e2e.test_lib import PY, deployed, launch  # noqa: F401 (deployed: the fixture)

pytestmark = pytest.mark.vm


@pytest.mark.parametrize("killed", [(0,), (0, 3)], ids=["rank 0", "rank 0 and rank 3"])
def test_survivors_of_rank_0_finish_together_on_the_lab(deployed, killed):  # noqa: F811
    hosts = [h.name for h in deployed.hosts[:3]]
    kills = " ".join(f"--kill 3:{r}" for r in killed)
    rc, by_rank, out = launch(
        deployed, hosts, f"{PY} $HOME/rxelab/apps/elastic_train.py --steps 12 --size 262144 "
        f"--pause 0.2 --admit-every 100 {kills}", per_host=2, port=29613, timeout=240,
        flags="--elastic")
    assert rc == 0, out[-4000:]
    survivors = [r for r in range(6) if r not in killed]
    done = {r: [e for e in by_rank.get(r, []) if e.get("event") == "done"] for r in survivors}
    assert all(len(d) == 1 for d in done.values()), out[-4000:]
    assert len({d[0]["params"] for d in done.values()}) == 1, "survivors disagree"
    assert all(d[0]["size"] == len(survivors) and d[0]["steps"] == 12 for d in done.values())
    for r in survivors:
        shrinks = [e for e in by_rank[r] if e.get("event") == "shrink"]
        assert shrinks and shrinks[-1]["lost"] == sorted(killed), (r, shrinks)
    for r in killed:
        assert any(e.get("event") == "dying" for e in by_rank.get(r, [])), out[-3000:]
