"""Slurm in the lab (issue 28), the host's side: what `make status` makes of each node's Slurm
state. The lab's own Slurm (MUNGE key, slurm.conf, the controller) is in test_nocloud; srun on
the lab is in tests/e2e/test_slurm.py."""

from __future__ import annotations

import pytest

from infra import status


@pytest.mark.parametrize("said, shown", [
    ("slurm idle\n", "idle"), ("slurm allocated\n", "allocated"), ("slurm down*\n", "down*"),
    ("slurm \n", "no answer"), ("slurm <script>\n", "no answer"), ("mtu data0 9000 4096\n", "-"),
])
def test_status_shows_each_nodes_slurm_state_and_never_what_it_cannot_read(said, shown):
    assert status.parse_slurm(said) == shown
