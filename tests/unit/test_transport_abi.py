"""The engine posts libibverbs' numbers from rxelab.transports.base, without pyverbs: a pyverbs
that numbered them otherwise must stop the import of rxelab.verbs, saying which."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from pyverbs import enums
from rxelab.transports import base

FAKE = Path(__file__).resolve().parent.parent / "fakeverbs"
LIB = Path(__file__).resolve().parents[2] / "lib"


def test_base_numbers_are_libibverbs_own():
    # the fake's enums are copied from libibverbs' verbs.h
    assert base.abi_differences(enums) == []
    assert base.ACCESS_REMOTE == enums.IBV_ACCESS_LOCAL_WRITE | enums.IBV_ACCESS_REMOTE_WRITE


def test_every_number_the_engine_may_use_is_checked_against_pyverbs():
    names = [n for n in vars(base) if n.startswith(("WR_", "WC_", "ACCESS_")) and n != "ACCESS_REMOTE"]
    assert sorted("IBV_" + n for n in names) == sorted(base.ABI)
    assert all(base.ABI["IBV_" + n] == getattr(base, n) for n in names)


def test_every_difference_is_named():
    wrong = SimpleNamespace(**{**base.ABI, "IBV_WR_SEND": 7})
    del wrong.IBV_WC_WITH_IMM
    assert base.abi_differences(wrong) == ["IBV_WR_SEND is 7, not 2", "IBV_WC_WITH_IMM is missing"]


def test_rxelab_verbs_refuses_a_pyverbs_with_other_numbers():
    code = (f"import sys; sys.path[:0] = [{str(FAKE)!r}, {str(LIB)!r}]\n"
            "import pyverbs.enums as e; e.IBV_WC_REM_ACCESS_ERR = 99\n"
            "try:\n    import rxelab.verbs\nexcept ImportError as err:\n    print(err)\n"
            "else:\n    print('imported')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "IBV_WC_REM_ACCESS_ERR is 99, not 10" in r.stdout, r.stdout


def test_without_pyverbs_verbs_is_refused_in_one_line_before_a_newcomer_knocks():
    code = (f"import sys; sys.path[:0] = [{str(LIB)!r}]; import site; site.main()\n"
            "import os, rxelab\n"
            "from rxelab.errors import ConfigError\n"
            "os.environ['RXELAB_JOB_TOKEN'] = 'o7MjB-iDsO6_bnLEIFBkYMa20z0jsE4Ee0KvJk83iU4'\n"
            "try:\n    rxelab.join('127.0.0.1', 9, wait=30)\n"
            "except ConfigError as err:\n    print(err)\n")
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    said = r.stdout.strip()
    assert "transport verbs needs pyverbs" in said and "python3-pyverbs" in said, said
