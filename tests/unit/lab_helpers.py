"""What the lab's host-side tests share: a free SSH port base, a lab name of their own, and the
infra CLI run on a state directory."""

from __future__ import annotations

import os
import random
import secrets
import socket
import subprocess
import sys
from pathlib import Path

from infra.config import REPO


def free_base(nodes: int = 3) -> int:
    """An SSH port base whose nodes' ports are free now, below Linux's ephemeral range (from
    32768), so no outgoing connection of another test can take one meanwhile."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - nodes)
        socks = []
        try:
            for port in range(base + 1, base + nodes + 1):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free block of SSH ports below 32000")

def infra(state_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infra", "--state-dir", str(state_dir), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def unique_lab() -> str:
    return "zt" + secrets.token_hex(3)
