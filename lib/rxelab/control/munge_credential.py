"""MUNGE as a job's credential where Slurm runs it: no secret to hand out, the cluster's own
authentication instead. Every cluster node's munged shares one key; a credential it encodes
names the uid that asked for it, expires (TTL), is refused if replayed, and here may be decoded
only by that same uid (`munge --restrict-uid`).

In the handshake of rxelab.control.handshake, each end's proof is a MUNGE credential whose payload is its
role, a digest of the transcript (both nonces, what the connection is for, the job's scope:
under srun its job and step ids) and a fresh random key. The other end decodes it (unmunge),
and takes it only if it is the same user's, of the opposite role, over this very transcript;
the connection is then sealed under both ends' keys, which nobody else could read. So a rank
talks only to processes of the same user and job, and another user on the node - who could
bind a port, but not obtain such a credential - is a stranger, as without MUNGE.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import shutil
import subprocess

from rxelab.control.handshake import CONNECTOR, LISTENER

SOCKETS = ("/run/munge/munge.socket.2", "/var/run/munge/munge.socket.2")
TTL_S = 60  # a proof is good for this long (munged refuses it after, and refuses it twice)
CALL_S = 5.0
MAX_PROOF = 1500  # a credential of this payload is a few hundred characters


def available() -> bool:
    """munge and unmunge on the PATH, and munged's socket there (the daemon runs)."""
    return bool(shutil.which("munge") and shutil.which("unmunge")
                and any(os.path.exists(s) for s in SOCKETS))


class MungeCredential:
    secured = True
    source = "MUNGE (the cluster's own authentication)"
    costly = True  # a proof is a process: a listener checks aside, at a rate (rxelab.control.accept_limits)
    same_user_only = True  # a proof names the uid that made it: only ours is taken

    def __init__(self, munge: str = "munge", unmunge: str = "unmunge") -> None:
        self.munge, self.unmunge = munge, unmunge
        self.uid = os.geteuid()

    def handshake(self) -> MungeHandshake:
        return MungeHandshake(self)

    def derive(self, label: bytes) -> None:
        return None  # munged's key never leaves it

    def __repr__(self) -> str:
        return "MungeCredential()"


class MungeHandshake:
    """One connection's two proofs: the keys they carry make the seal's."""

    def __init__(self, credential: MungeCredential) -> None:
        self.credential = credential
        self.keys: dict[bytes, bytes] = {}  # role -> the key its proof carried

    def prove(self, role: bytes, transcript: bytes) -> str:
        key = secrets.token_bytes(32)
        self.keys[role] = key
        payload = f"rxelab {role.decode()} {_digest(transcript)} {key.hex()}"
        r = _call([self.credential.munge, "--restrict-uid", str(self.credential.uid),
                   "--ttl", str(TTL_S), "--string", payload])
        return r.strip() if r is not None else ""

    def check(self, role: bytes, transcript: bytes, proof: str) -> bool:
        """The other end's proof: the same user's credential, of `role`, over this transcript."""
        if not 0 < len(proof) <= MAX_PROOF or not proof.isprintable() or \
                not proof.startswith("MUNGE:"):
            return False
        out = _call([self.credential.unmunge], proof)
        if out is None:
            return False
        meta, _, payload = out.partition("\n\n")
        fields = dict(line.split(":", 1) for line in meta.splitlines() if ":" in line)
        status, uid = fields.get("STATUS", "").strip(), fields.get("UID", "")
        if not status.startswith("Success") or f"({self.credential.uid})" not in uid:
            return False
        parts = payload.strip().split(" ")
        if len(parts) != 4 or parts[:2] != ["rxelab", role.decode()] or \
                not hmac.compare_digest(parts[2], _digest(transcript)):
            return False
        try:
            key = bytes.fromhex(parts[3])
        except ValueError:
            return False
        if len(key) != 32:
            return False
        self.keys[role] = key
        return True

    def seal_key(self, transcript: bytes) -> bytes:
        both = self.keys.get(CONNECTOR, b"") + self.keys.get(LISTENER, b"")
        assert len(both) == 64, "a seal needs both ends' proofs"
        return hmac.new(both, b"rxelab munge seal\0" + transcript, hashlib.sha256).digest()


def _digest(transcript: bytes) -> str:
    return hashlib.sha256(transcript).hexdigest()


def _call(argv: list[str], stdin: str | None = None) -> str | None:
    """A munge or unmunge call's output, or None if it failed (no daemon, a bad credential)."""
    try:
        r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=CALL_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None
