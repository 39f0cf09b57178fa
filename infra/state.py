"""Where a lab keeps its files. A lab is its state directory: config, keys, seeds, overlays,
serial logs, pid files, QMP sockets and the inventory all live under it, and `destroy`
removes it whole."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infra.config import LabConfig
from infra.errors import LabError


@dataclass(frozen=True)
class LabState:
    root: Path

    @property
    def config_file(self) -> Path:
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


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Readers (Fabric, tests, Terraform) never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
