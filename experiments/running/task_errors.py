"""What an expected failure of a `fab` task looks like: one line that says what happened and
what to do, never a traceback. A timeout, a node that is gone or will not answer, a missing
tool, bad input: each is expected on the machines people have. `fab --debug` (or
INVOKE_DEBUG=1) shows the traceback instead, for a bug report.

Light to import: every `fab` command loads the fabfile, which wraps each task with this, so
the modules that raise the expected errors (the spec's models, the fleet's connections) are
imported when a task has failed, not to list the tasks.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from invoke.exceptions import CommandTimedOut, Exit, Failure, UnexpectedExit

from infra.errors import LabError

F = TypeVar("F", bound=Callable[..., Any])


def expected() -> tuple[type[BaseException], ...]:
    """The errors a task ends with in one line: the lab's, the fleet's, a spec's, a stalled
    node's, a failed command's, a lost SSH connection's, the system's."""
    import paramiko

    from experiments.running.fleet import FleetError
    from experiments.running.watched import Stalled
    from experiments.spec import SpecError

    return (LabError, FleetError, SpecError, Stalled, Failure, paramiko.SSHException, EOFError,
            OSError)


def debugging() -> bool:
    """`fab -d/--debug` turns on invoke's debug logging, on the root logger."""
    return logging.getLogger().isEnabledFor(logging.DEBUG)


def describe(err: BaseException) -> str:
    """One line for an expected failure."""
    import paramiko

    if isinstance(err, CommandTimedOut):
        from experiments.running.deploy import STALL_SETTING

        host = getattr(getattr(err.result, "connection", None), "host", "a node")
        return (f"a command on {host} did not finish within {err.timeout:.0f} s and was stopped "
                f"(a busy node needs longer: {STALL_SETTING})")
    if isinstance(err, UnexpectedExit):
        host = getattr(getattr(err.result, "connection", None), "host", "a node")
        return f"a command on {host} failed (exit {err.result.exited}): {err.result.command[:120]}"
    if isinstance(err, paramiko.SSHException | EOFError | ConnectionError | TimeoutError):
        return f"lost a node over SSH: {err or type(err).__name__}"
    return str(err).strip() or type(err).__name__


def one_line_errors(task_body: F) -> F:
    """Wrap a task's body: its expected failures end it with `error: ...` and exit 1."""
    @functools.wraps(task_body)
    def body(*args: Any, **kwargs: Any) -> Any:
        try:
            return task_body(*args, **kwargs)
        except Exit:
            raise
        except KeyboardInterrupt:
            if debugging():
                raise
            raise Exit("interrupted", code=130) from None
        except Exception as err:
            if debugging() or not isinstance(err, expected()):
                raise
            raise Exit(f"error: {describe(err)}", code=1) from None
    return body  # type: ignore[return-value]
