"""A stand-in for MUNGE's `munge` and `unmunge`, for tests on a host without munged: the same
command lines and output, and the same promises - a credential names the uid that made it,
expires, is refused the second time it is decoded, and is refused to another uid when made
with --restrict-uid. "Another user" is another directory of these scripts (another uid),
sharing the cluster's key and its record of credentials already seen."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

SCRIPT = r'''#!{python}
import base64, hashlib, hmac, json, os, sys, time
UID, KEY, SEEN = {uid}, {key!r}.encode(), {seen!r}
me = os.path.basename(sys.argv[0])
if me == "munge":
    args = sys.argv[1:]
    opt = dict(zip(args[::2], args[1::2]))
    body = {{"uid": UID, "payload": opt.get("--string", ""), "restrict": opt.get("--restrict-uid"),
            "ttl": int(opt.get("--ttl", "300")), "time": time.time(),
            "salt": base64.b64encode(os.urandom(12)).decode()}}
    raw = json.dumps(body).encode()
    mac = hmac.new(KEY, raw, hashlib.sha256).hexdigest()
    print("MUNGE:" + base64.b64encode(raw).decode() + ":" + mac + ":")
    sys.exit(0)
cred = sys.stdin.read().strip()
try:
    _, raw, mac, _ = cred.split(":")
    raw = base64.b64decode(raw)
    assert hmac.compare_digest(hmac.new(KEY, raw, hashlib.sha256).hexdigest(), mac)
    body = json.loads(raw)
except Exception:
    print("unmunge: Error: Invalid credential format", file=sys.stderr)
    sys.exit(7)
if body["restrict"] is not None and int(body["restrict"]) != UID:
    print("unmunge: Error: Unauthorized credential for client UID", file=sys.stderr)
    sys.exit(16)
if time.time() > body["time"] + body["ttl"]:
    print("unmunge: Error: Expired credential", file=sys.stderr)
    sys.exit(15)
seen = open(SEEN).read().split() if os.path.exists(SEEN) else []
if mac in seen:
    print("unmunge: Error: Replayed credential", file=sys.stderr)
    sys.exit(17)
with open(SEEN, "a") as f:
    f.write(mac + "\n")
print("STATUS:          Success (0)")
print("UID:             user%d (%d)" % (body["uid"], body["uid"]))
print("GID:             user%d (%d)" % (body["uid"], body["uid"]))
print()
print(body["payload"])
'''


def install(where: Path, uid: int, key: str = "the cluster's munge key",
            seen: Path | None = None) -> Path:
    """munge and unmunge for a user of this uid, in `where` (put it first on the PATH)."""
    where.mkdir(parents=True, exist_ok=True)
    record = seen or where.parent / "munge-seen"
    text = SCRIPT.format(python=sys.executable, uid=uid, key=key, seen=str(record))
    for name in ("munge", "unmunge"):
        path = where / name
        path.write_text(text)
        path.chmod(0o755)
    return where


def run_munged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's munged: the scripts first on the PATH, and a socket where rxelab.control.munge_credential
    looks for one (it takes MUNGE as there only where munged's socket is)."""
    from rxelab.control import munge_credential

    where = install(tmp_path / "bin", os.geteuid())
    sock = tmp_path / "munge.socket.2"
    sock.write_text("")
    monkeypatch.setattr(munge_credential, "SOCKETS", (str(sock),))
    monkeypatch.setenv("PATH", f"{where}:{os.environ['PATH']}")
