"""The library keeps the promises of its docs (issue 16) about init's options, on the
in-memory fabric: one table declares them (docs/library.md's and the bench's lists come from it);
each is checked and named when wrong; ranks that disagree on one all fail at init. Each test is
named for a defect a second reader reproduced, and failed before it was mended."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import rxelab
from rxelab import settings
from rxelab.errors import ConfigError

from infra.config import REPO
from tests.unit.fakejob import run_ranks


def test_the_library_page_lists_the_options_of_init_as_the_table_declares_them():
    assert settings.markdown_table() in (REPO / "docs" / "library.md").read_text()


@pytest.mark.parametrize("option, value", [
    ("slots", 0), ("slots", -1), ("send_depth", 0), ("timeout", math.inf), ("timeout", math.nan),
    ("timeout", 0), ("timeout", "60"), ("eager_limit", True), ("window", 1.5), ("chunk", None),
    ("qp_timeout", 32), ("retry_cnt", 8), ("pin_limit", 10),
])
def test_every_option_of_init_is_checked_and_named(option, value):
    """#10: slots=0 gave a raw PyverbsRDMAError, send_depth=0 a later 'no progress',
    timeout=inf an OverflowError, timeout=nan a hang."""
    with pytest.raises(ConfigError, match=f"^{option}="):
        rxelab.init(0, 1, device="fake0", **{option: value})


def test_numpy_numbers_are_numbers():
    assert settings.resolve({"slots": np.int64(8), "timeout": np.float32(2.5)}) ["slots"] == 8


def test_an_unknown_option_is_named():
    with pytest.raises(ConfigError, match="unknown option eagerlimit"):
        rxelab.init(0, 1, device="fake0", eagerlimit=0)


def test_ranks_that_disagree_on_a_shared_option_all_fail_at_init_naming_it():
    def job(comm):
        return "started"

    def rank_options(r: int) -> dict[str, int]:
        return {"eager_limit": 65536 if r == 2 else 4096}

    out = run_ranks(3, job, keep_errors=True, per_rank=rank_options)
    for r, err in enumerate(out):
        assert isinstance(err, rxelab.RdmaError), (r, err)
        assert "rank 2 has eager_limit=65536, rank 0 has eager_limit=4096" in str(err), (r, err)


def test_bench_prints_every_setting_as_nccl_tests_does():
    from rxelab import bench_report

    class Comm:
        rank, size, options, transport = 0, 2, settings.resolve({"eager_limit": 0}), "verbs"
        dev = type("Dev", (), {"name": "fake0", "port": 1, "gid_index": 1, "mtu_enum": 5})()

    seen = bench_report.Gathered(["a", "b"], [4096, 4096], "the RDMA port's active MTU", True)
    line = next(x for x in bench_report.lines(bench_report.describe(Comm(), "rxelab-bench",
                                                                     "iterations 1", seen))
                if x.startswith("# settings"))
    for o in settings.OPTIONS:
        assert re.search(rf"\b{o.name}=", line), o.name
    assert "eager_limit=0" in line
