"""A user's small document files (an inventory, an experiment spec): read with a size bound,
as strict UTF-8, and parsed, so that whatever a user points at - a directory, a binary or
UTF-16 file, something huge, a list nested without end, a number of thousands of digits - is
one clear reason, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_BYTES = 1 << 20


class DocumentError(Exception):
    """Why a file is not a usable document (the caller says which kind it was to be)."""


def load(path: Path, parse: Callable[[str], Any], syntax: str, max_bytes: int = MAX_BYTES) -> Any:
    """parse(text) of the file; `syntax` names the format in "not valid JSON: ..."."""
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except IsADirectoryError:
        raise DocumentError("is a directory") from None
    except FileNotFoundError:
        raise DocumentError("no such file") from None
    except PermissionError:
        raise DocumentError("not readable (permission denied)") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise DocumentError(f"cannot be read: {err}") from None
    if len(data) > max_bytes:
        raise DocumentError(f"larger than {max_bytes >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DocumentError(f"not UTF-8 text (byte {err.start})") from None
    try:
        return parse(text)
    except RecursionError:
        raise DocumentError("nested too deeply") from None
    except ValueError as err:  # the parsers' syntax errors are ValueErrors too
        if "int" in str(err) and "digits" in str(err):  # int() reads a bounded number of digits
            raise DocumentError(f"a number too large (more than {sys.get_int_max_str_digits()} "
                                "digits)") from None
        raise DocumentError(f"not valid {syntax}: {err}") from None


def spell(loc: tuple[str | int, ...]) -> str:
    """A validation error's location as a reader writes it: runs[0].netem[2]."""
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
    return text.lstrip(".") or "top level"
