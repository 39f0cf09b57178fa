"""CPU-bound processes beside the lab, as other people's work on a shared host: each in a
session of its own (so the kernel's autogroups weigh each one as a separate user's job, not
all together as one), each stopped by its own pid. The shared lab boots and deploys beside
them (tests/conftest.py): a boot or deploy that only works on a quiet host fails there.
Each also ends by itself once the process that started it is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

from infra import run as runner

# busy until stopped, or until the process that started it is gone (reparented): a test
# process ended at once (xdist's os._exit after a SIGTERM, a SIGKILL) runs no __exit__, and
# hogs in sessions of their own would spin on for good
SPIN = "import os, sys\nwhile os.getppid() == int(sys.argv[1]): pass"  # argv[1]: its starter


def default_count() -> int:
    """RXELAB_TEST_HOGS, or twice as many as the host has cores."""
    return int(os.environ.get("RXELAB_TEST_HOGS") or 2 * (os.cpu_count() or 1))


@dataclass
class Hogs:
    count: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __enter__(self) -> Hogs:
        for _ in range(self.count):
            self.procs.append(subprocess.Popen([sys.executable, "-c", SPIN, str(os.getpid())],
                                               start_new_session=True,
                                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        return self

    def cpu_seconds(self) -> list[float]:
        """What each has used so far (utime + stime): proof that the host was really busy."""
        out = []
        for p in self.procs:
            fields = runner.stat_fields(p.pid)
            out.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0)
        return out

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
