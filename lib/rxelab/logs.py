"""The library's log switch, as NCCL_DEBUG is NCCL's: RXELAB_LOG_LEVEL=debug|info|warning|error
(any case), or RXELAB_DEBUG=1 for debug. Every module logs under the "rxelab" logger by its
own name (logging.getLogger(__name__)); only when a variable is set does the library add a
handler of its own, to stderr, each line naming its host, process and rank, so that the lines
of a job's ranks can be told apart once merged (rxelab-launch, srun). Otherwise it configures
nothing, as a library should: its records go where the program's logging sends them, and a
program that set up no logging sees warnings and errors alone, as bare lines on stderr
(Python's logging.lastResort) - which is why the library adds no NullHandler, which would
silence them.

init(), join(), the torch backend and the console scripts call configure(): a wrong value is
refused there, in one line that names the right ones.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping

from rxelab.bootstrap import SOURCES
from rxelab.errors import ConfigError
from rxelab.settings import DEBUG_ENV, LOG_LEVEL_ENV, LOG_LEVELS

ROOT = "rxelab"
FORMAT = "%(asctime)s %(host)s:%(process)d [%(rank)s] %(levelname)s %(name)s: %(message)s"


def level_from(env: Mapping[str, str]) -> int | None:
    """The level the environment asks for (the more verbose where both variables are set),
    or None: the library stays silent about its handlers."""
    raw = env.get(LOG_LEVEL_ENV, "").strip()
    debug = env.get(DEBUG_ENV, "").strip()
    if raw and raw.lower() not in LOG_LEVELS:
        raise ConfigError(f"{LOG_LEVEL_ENV}={raw!r}: no such log level",
                          hint=f"one of {', '.join(LOG_LEVELS)} (in any case)")
    if debug not in ("", "0", "1"):
        raise ConfigError(f"{DEBUG_ENV}={debug!r}: 1 turns the library's debug log on, 0 "
                          "leaves it off", hint=f"or {LOG_LEVEL_ENV}=debug")
    levels = [int(logging.getLevelName(raw.upper()))] if raw else []
    if debug == "1":
        levels.append(logging.DEBUG)
    return min(levels) if levels else None


class _Where(logging.Filter):
    """Puts this process's host and rank on each record the switch's handler writes."""

    def __init__(self, env: Mapping[str, str]) -> None:
        super().__init__()
        self.host = socket.gethostname() or "?"
        self.rank = next((env[name] for _, name, _ in SOURCES if env.get(name)), "-")

    def filter(self, record: logging.LogRecord) -> bool:
        record.host, record.rank = self.host, self.rank
        return True


_installed: tuple[logging.Handler, _Where] | None = None
_installing = threading.Lock()  # communicators of one process may form at once, on threads


def configure(env: Mapping[str, str] | None = None) -> None:
    """Apply the switch; each call reads it again (cheap: two variables), so a process may
    turn it off. With it off, the library touches no logging configuration it did not make."""
    level = level_from(os.environ if env is None else env)
    with _installing:
        _switch(level, os.environ if env is None else env)


def _switch(level: int | None, env: Mapping[str, str]) -> None:
    global _installed
    logger = logging.getLogger(ROOT)
    if level is None:
        if _installed is not None:
            logger.removeHandler(_installed[0])
            logger.setLevel(logging.NOTSET)
            logger.propagate = True
            _installed = None
        return
    if _installed is None:
        where = _Where(env)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        handler.addFilter(where)
        logger.addHandler(handler)
        _installed = (handler, where)
    logger.setLevel(level)
    # the switch's lines once, in its format: not again through the program's own handlers
    logger.propagate = False


def at_rank(rank: int) -> None:
    """The rank the switch's lines name from now on (a communicator's, as it forms)."""
    if _installed is not None:
        _installed[1].rank = str(rank)
