"""Paths only the caller (or root) can change: what a lab's state directory, the cache and
the programs and images taken from it must be before anything in them is read, run or
written.

A directory is only as private as the directories above it: whoever can write a parent can
rename the directory away and put a symbolic link to one of their own in its place, after
any check of the directory itself. So, as OpenSSH's StrictModes does, every directory on the
way from / is checked: owned by root or the caller, and writable by nobody else unless it is
sticky (as /tmp is: there others cannot rename or remove what is not theirs). A symbolic
link on the way must be root's or the caller's, and its target's way is checked in turn.
Once the chain holds, nobody else can change what a name resolves to, so resolving it again
later is safe. Writes of ours never follow a link planted at their path (open_private)."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path
from typing import IO

from infra.config import cache_dir
from infra.errors import LabError

UNSET_LOGIN_UID = 2**32 - 1  # (uid_t)-1: no login recorded one
MAX_LINKS = 40  # as the kernel's limit on links followed in one lookup
CACHE_HINT = ("RXELAB_CACHE (default $XDG_CACHE_HOME/rxelab) must be a directory of your own that "
              "only you can write, as must every directory above it")


def check_chain(path: Path, acting_in: Path | None = None, *, consequence: str = "",
                hint: str | None = None) -> None:
    """Every existing directory from / down to `path` (and `path` itself) is root's or the
    caller's and writable by no one else unless sticky; links on the way are followed, each
    root's or the caller's. What does not exist yet is not looked at: it will be made by us
    inside a directory that passed. Refused in one line naming the offending path and what
    we were about to act in (`acting_in`, default `path`), with `consequence` after it."""
    refuse = _Refusal(f"refusing to act in {acting_in or path}{consequence}", hint)
    try:
        todo = list(Path(os.getcwd(), path).parts[1:])
    except OSError as err:
        raise refuse(f"cannot tell where {path} is ({err.strerror or err})") from None
    here = Path("/")
    _check_entry(here, _lstat(here, refuse), refuse)
    links = 0
    while todo:
        name = todo.pop(0)
        if name == "..":
            here = here.parent  # `here` has no links in it: its parent is its real parent
            continue
        step = here / name
        try:
            info = os.lstat(step)
        except FileNotFoundError:
            return
        except OSError as err:
            raise refuse(f"cannot look at {step} ({err.strerror or err})") from None
        if stat.S_ISLNK(info.st_mode):
            if not _trusted_owner(info.st_uid, invoker_too=True):
                raise refuse(f"{step} is a symbolic link of uid {info.st_uid}, neither you "
                             f"(uid {os.geteuid()}) nor root")
            links += 1
            if links > MAX_LINKS:
                raise refuse(f"{path} goes through more than {MAX_LINKS} symbolic links")
            try:
                link = Path(os.readlink(step))
            except OSError as err:
                raise refuse(f"cannot read the link {step} ({err.strerror or err})") from None
            if link.is_absolute():
                here, todo = Path("/"), [*link.parts[1:], *todo]
            else:
                todo = [*link.parts, *todo]
            continue
        _check_entry(step, info, refuse, invoker_too=True)
        here = step


def check_owned_file(path: Path, use: str, *, hint: str | None = None) -> None:
    """A file we are about to run or trust (a program, an image, a manifest): a regular file,
    not a link, root's or the caller's, and writable by no one else."""
    refuse = _Refusal(f"refusing to {use} it", hint)
    try:
        info = os.lstat(path)
    except OSError as err:
        raise refuse(f"cannot look at {path} ({err.strerror or err})") from None
    if stat.S_ISLNK(info.st_mode):
        raise refuse(f"{path} is a symbolic link")
    if not stat.S_ISREG(info.st_mode):
        raise refuse(f"{path} is not a regular file")
    _check_entry(path, info, refuse)


def cache_subdir(*parts: str, make: bool = False) -> Path:
    """The cache directory (or a directory under it), checked all the way up by the name the
    caller gave, links and all, before anything is made in it; when `make`, made and checked
    again (in a sticky parent another user could have made it first). Returned resolved, once:
    with the chain checked nobody else can change where it leads, and every later use goes to
    the directory checked, not to wherever a name leads by then."""
    path = cache_dir().joinpath(*parts)
    check_chain(path, hint=CACHE_HINT)
    if make:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise LabError(f"cannot make the cache directory {path}: {err.strerror or err}",
                           hint=CACHE_HINT) from None
        check_chain(path, hint=CACHE_HINT)
    try:
        return path.resolve()
    except (OSError, RuntimeError) as err:
        raise LabError(f"cannot resolve the cache directory {path}: {err}", hint=CACHE_HINT) from None


def open_private(path: Path, mode: str = "w", *, append: bool = False) -> IO[str]:
    """A file of ours opened for writing (made 0600, else truncated unless `append`), never
    through a symbolic link planted at its path: refused in one line instead."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_APPEND if append else os.O_TRUNC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as err:
        if os.path.islink(path):
            raise LabError(f"{path} is a symbolic link: refusing to write through it",
                           hint="remove the link; nobody but you can have made it there") from None
        raise LabError(f"cannot write {path}: {err.strerror or err}") from None
    return os.fdopen(fd, mode)


def _lstat(path: Path, refuse: _Refusal) -> os.stat_result:
    try:
        return os.lstat(path)
    except OSError as err:
        raise refuse(f"cannot look at {path} ({err.strerror or err})") from None


def _check_entry(path: Path, info: os.stat_result, refuse: _Refusal, *,
                 invoker_too: bool = False) -> None:
    euid = os.geteuid()
    if not _trusted_owner(info.st_uid, invoker_too=invoker_too):
        raise refuse(f"{path} belongs to uid {info.st_uid}, neither you (uid {euid}) nor root")
    writable = info.st_mode & 0o002 or (info.st_mode & 0o020 and not _private_group(info))
    if writable and not (stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
        kind = ", not sticky" if stat.S_ISDIR(info.st_mode) else ""
        raise refuse(f"{path} can be written by other users (mode "
                     f"{stat.S_IMODE(info.st_mode):04o}{kind})")


def _trusted_owner(uid: int, *, invoker_too: bool = False) -> bool:
    """Root and the caller; for the directories on the way (`invoker_too`), under sudo also
    the user who ran it (`sudo make provision` in one's own checkout), never for a file that
    is run or booted. Their sudo made them root already, so trusting their directories gives
    nobody anything new; a SUDO_UID that outlived its sudo (a shell handed on, a service
    started from it) is told by the login uid the kernel keeps, which it must then equal."""
    if uid in (0, os.geteuid()):
        return True
    if not invoker_too or os.geteuid() != 0:
        return False
    sudo_uid = os.environ.get("SUDO_UID", "")
    if not (sudo_uid.isdigit() and int(sudo_uid) == uid):
        return False
    login = login_uid()
    return login is None or login == uid


def login_uid() -> int | None:
    """The uid the kernel recorded at login (kept across sudo and su, not changed by its
    user), or None where no login set one (a container, a system service)."""
    try:
        value = int(Path("/proc/self/loginuid").read_text().strip())
    except (OSError, ValueError):
        return None
    return None if value == UNSET_LOGIN_UID else value


def _private_group(info: os.stat_result) -> bool:
    """Group-writable is harmless when the group is its owner's own (a user private group,
    Debian's default with umask 002): named as the owner, the owner's primary group, no one
    else listed in it, and no other user's primary group (those are not listed)."""
    try:
        owner = pwd.getpwuid(info.st_uid)
        group = grp.getgrgid(info.st_gid)
    except KeyError:
        return False
    if not (owner.pw_gid == info.st_gid and group.gr_name == owner.pw_name
            and set(group.gr_mem) <= {owner.pw_name}):
        return False
    return all(user.pw_uid == owner.pw_uid for user in pwd.getpwall() if user.pw_gid == info.st_gid)


class _Refusal:
    """The one-line refusal: '<what is wrong>: <tail>', with the hint."""

    def __init__(self, tail: str, hint: str | None) -> None:
        self.tail, self.hint = tail, hint

    def __call__(self, why: str) -> LabError:
        return LabError(f"{why}: {self.tail}", hint=self.hint)
