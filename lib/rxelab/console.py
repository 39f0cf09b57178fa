"""What the console scripts (rxelab-launch, rxelab-bench, rxelab-selftest) do at their edge: an
expected failure - a ConfigError or any other error the library raises on purpose, a connection
refused or timed out, Ctrl-C - ends the script with one line on stderr and a non-zero status;
anything else is a bug, and keeps its traceback so that it can be reported. With the log switch
on (rxelab.logs), the expected failure's traceback is logged at debug level too.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Protocol

from rxelab import logs
from rxelab.errors import RdmaError

log = logging.getLogger(__name__)


class Main(Protocol):
    """A console script's main(): its arguments (None: sys.argv's), its exit status."""

    def __call__(self, argv: list[str] | None = None) -> int: ...


FAILED = 2  # as argparse's own refusals
INTERRUPTED = 130  # as a shell says of a command ended by SIGINT

# what the world, not the code, gets wrong: the library's own errors, and the network's
EXPECTED: tuple[type[BaseException], ...] = (RdmaError, ConnectionError, TimeoutError)


def one_line_errors(prog: str, expected: tuple[type[BaseException], ...] = ()) -> Callable[[Main], Main]:
    """main() with the log switch applied and expected failures said in one line, as
    `prog: what went wrong`. expected: what else is expected of this script (the launcher's
    missing ssh, FileNotFoundError)."""
    caught = EXPECTED + expected

    def wrap(main: Main) -> Main:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                logs.configure()
                return main(argv)
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr, flush=True)
                return INTERRUPTED
            except caught as err:
                log.debug("%s failed", prog, exc_info=True)
                print(f"{prog}: {said(err)}", file=sys.stderr, flush=True)
                return FAILED
        return run
    return wrap


def said(err: BaseException) -> str:
    """An error in words: the library's as it says itself, an OS error with what it concerns."""
    if isinstance(err, RdmaError):
        return str(err)
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}: {err.filename}" if err.filename else err.strerror
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
