"""What the tests of directories another user can reach share: a directory in /tmp (not the
test's own tmp_path, which lies under a private parent) and no sudo in the environment
(under sudo the invoking user's directories are trusted too: not these tests' subject)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def not_under_sudo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUDO_UID", raising=False)


@contextlib.contextmanager
def dir_in_tmp(prefix: str) -> Iterator[Path]:
    """A new directory in /tmp, which another user can reach; removed at the end."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
