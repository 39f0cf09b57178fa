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
    assert len(base.ABI) == len(set(base.ABI)) and all(k.startswith("IBV_") for k in base.ABI)


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
