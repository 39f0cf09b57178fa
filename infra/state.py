"""Where a lab keeps its files. A lab is its state directory: config, keys, seeds, overlays,
serial logs, pid files, QMP sockets and the inventory all live under it.

A directory is a lab only if it carries the lab's marker, written when provisioning first
claims it; `destroy` refuses any other directory (RXELAB_STATE=~ must never wipe a home) and
removes only the entries a lab makes. The marker also holds the lab's id, with which the
host-side things a lab creates (its namespace's bridge, its taps) are labelled, so a lab
removes only what carries its own id. The directory is private (0700): it holds the keys
every node trusts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from infra import lab_settings
from infra.config import LabConfig
from infra.errors import LabError
from infra.owned_paths import check_chain

MARKER = "rxelab-lab.json"
MARKER_KIND = "rxelab lab state"
TEMP_SUFFIX = ".rxelab-tmp"  # write_atomic's temporaries: .<name>.<random><TEMP_SUFFIX>
# What a lab creates at its root, and so all that destroy removes (with the marker, last).
OWNED = ("request.json", "lab.json", "inventory.json", "boot.json", "known_hosts", "keys", "run",
         "logs", "disks", "seeds", "terraform")


@dataclass(frozen=True)
class LabState:
    root: Path

    @property
    def marker(self) -> Path:
        return self.root / MARKER

    def lab_id(self) -> str | None:
        """This lab's id from its marker; None when the directory is not (yet) a lab."""
        try:
            doc = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return None
        ok = isinstance(doc, dict) and doc.get("kind") == MARKER_KIND and isinstance(doc.get("id"), str)
        return doc["id"] if ok and doc["id"].isalnum() else None

    def is_lab(self) -> bool:
        return self.lab_id() is not None or self.made_before_markers()

    def made_before_markers(self) -> bool:
        """A lab made before the marker existed: no marker, and its lab.json names this very
        directory."""
        if self.marker.exists():
            return False
        try:
            doc = json.loads(self.config_file.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(doc, dict) and doc.get("state_dir") == str(self.root)

    def check_own(self) -> None:
        """The directory is the caller's own and nobody else can write in it (nor in its
        Terraform state): another user's lab, or one they could change under us, would have
        us run what they wrote (Terraform runs the commands its state records). Refused
        before anything in it is read, claimed, run or removed. The directories above it too
        (owned_paths.check_chain): whoever can write one of them can swap the lab for theirs
        after this check."""
        check_chain(self.root.parent, self.root, consequence="; nothing was changed",
                    hint="point RXELAB_STATE at a directory of your own, under directories "
                         "only you (or root) can write")
        for path in (self.root, self.terraform, self.terraform / "terraform.tfstate"):
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            except OSError as err:
                raise LabError(f"cannot look at {path}: {err.strerror or err}") from None
            if stat.S_ISLNK(info.st_mode):
                why = "is a symbolic link"
            elif info.st_uid != os.geteuid():
                why = f"belongs to uid {info.st_uid}, not to you (uid {os.geteuid()})"
            elif info.st_mode & 0o022:
                why = "can be written by other users"
            else:
                continue
            raise LabError(f"{path} {why}: refusing to use it as a lab's state; nothing was changed",
                           hint="point RXELAB_STATE at a directory of your own that only you "
                                "can write")

    def check_claimable(self) -> None:
        """Refuse a directory that holds something other than a lab, or that is not the
        caller's own, before anything is done."""
        self.check_own()
        if self.root.exists() and not self.root.is_dir():
            raise LabError(f"the lab's state directory {self.root} is a file",
                           hint="point RXELAB_STATE at a new or empty directory")
        if self.root.exists() and not self.is_lab() and any(self.root.iterdir()):
            raise LabError(f"{self.root} is not empty and is not an rxelab lab (it has no {MARKER}): "
                           "refusing to use it as a lab's state directory",
                           hint="point RXELAB_STATE at a new or empty directory")

    def claim(self) -> str:
        """Make the directory this lab's (private, marked) and return the lab's id."""
        self.check_claimable()
        try:
            mkdir_private(self.root)
            self.check_own()  # made, or found made by another user in a sticky parent?
            os.chmod(self.root, 0o700)
            lab_id = self.lab_id()
            if lab_id is None:
                lab_id = secrets.token_hex(6)
                write_atomic(self.marker, json.dumps({"kind": MARKER_KIND, "id": lab_id,
                                                      "created": int(time.time())}) + "\n")
        except OSError as err:
            raise LabError(f"cannot make {self.root} a lab's directory: {err.strerror or err}",
                           hint="point RXELAB_STATE at a directory of your own") from None
        return lab_id

    def require_id(self) -> str:
        lab_id = self.lab_id()
        if lab_id is None:
            raise LabError(f"{self.root} is not an rxelab lab (no {MARKER})",
                           hint="run `make provision` first")
        return lab_id

    @property
    def request_file(self) -> Path:
        """The lab's config as `make provision` was asked for it (IMAGE=auto and the like not
        yet resolved): written once, before Terraform runs, and read by the configure step."""
        return self.root / "request.json"

    @property
    def config_file(self) -> Path:
        """The lab's config as the configure step resolved it: what every later step reads."""
        return self.root / "lab.json"

    @property
    def inventory_file(self) -> Path:
        return self.root / "inventory.json"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def ssh_key(self) -> Path:
        return self.keys / "id_ed25519"

    @property
    def cluster_key(self) -> Path:
        return self.keys / "cluster_ed25519"

    @property
    def munge_key(self) -> Path:
        """The lab's MUNGE key (base64), which its Slurm authenticates with."""
        return self.keys / "munge.key.b64"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def disks(self) -> Path:
        return self.root / "disks"

    @property
    def seeds(self) -> Path:
        return self.root / "seeds"

    @property
    def terraform(self) -> Path:
        return self.root / "terraform"

    def pidfile(self, name: str) -> Path:
        return self.run / f"{name}.pid"

    def qmp_socket(self, name: str) -> Path:
        return self.run / f"{name}.qmp"

    def serial_log(self, name: str) -> Path:
        return self.logs / f"{name}.serial.log"

    def overlay(self, name: str) -> Path:
        return self.disks / f"{name}.qcow2"

    def seed_iso(self, name: str) -> Path:
        return self.seeds / f"{name}-seed.iso"

    def host_key(self, name: str) -> Path:
        return self.keys / f"{name}_host_ed25519"

    def load_config(self) -> LabConfig:
        try:
            return LabConfig.from_json(self.config_file.read_text())
        except FileNotFoundError:
            raise LabError(
                f"no lab is configured in {self.root}", hint="run `make provision` first"
            ) from None

    def save_config(self, config: LabConfig) -> None:
        write_atomic(self.config_file, config.to_json())

    def save_request(self, config: LabConfig) -> str:
        """Write the config provision was asked for; return its digest, which Terraform is
        given so that a changed setting replaces the lab. The digest covers the lab settings
        (infra/lab_settings.py) alone, as Terraform's trigger did when it was given each of them:
        a field added to the config, or where state lives, replaces nothing."""
        write_atomic(self.request_file, config.to_json())
        chosen = json.loads(config.to_json())
        asked = {s.field: chosen[s.field] for s in lab_settings.LAB_SETTINGS}
        return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()

    def load_request(self) -> LabConfig:
        try:
            return LabConfig.from_json(self.request_file.read_text())
        except FileNotFoundError:
            raise LabError(f"no lab configuration was written to {self.request_file}",
                           hint="run `make provision`: it writes it before Terraform runs") from None


def mkdir_private(path: Path) -> Path:
    """path and every missing parent, made 0700 whatever the umask (mkdir's mode= covers only
    the last one)."""
    for missing in reversed([p for p in (path, *path.parents) if not p.exists()]):
        missing.mkdir(mode=0o700, exist_ok=True)
    return path


def write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """Readers (Fabric, tests, Terraform) never see half a file; it is private from its first
    byte (mkstemp makes 0600 files), also when a crash leaves the temporary behind."""
    mkdir_private(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def own_temporary(name: str, owned: tuple[str, ...]) -> bool:
    """Whether `name` is a temporary write_atomic left of one of the `owned` files (and
    nothing else: a user's .lab.json.orig or .keys.backup is theirs)."""
    found = re.fullmatch(r"\.(.+)\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX), name)
    return found is not None and found.group(1) in owned
