"""A lab's state directory is the caller's own before anything in it is claimed, run or
removed, and destroy removes only its own temporaries (issue 27, items 5 and 6). Each test
failed before: another user's directory was adopted and its Terraform state run (as root),
and a user's `.lab.json.orig` went with the lab."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra import cli, lab, terraform
from infra.config import REPO, LabConfig
from infra.errors import LabError
from infra.state import MARKER, LabState, write_atomic
from tests.unit.lab_helpers import free_base

OTHER_UID = 4242


def infra(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infra", "--state-dir", str(state_dir), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def planted_lab(root: Path) -> Path:
    """A directory shaped as a lab with Terraform state whose destroy-time provisioner would
    run a command: what another user could leave for root to destroy."""
    state = LabState(root)
    state.claim()
    state.save_config(LabConfig(lab="zz" + os.urandom(3).hex(), state_dir=root))
    state.terraform.mkdir(exist_ok=True)
    (state.terraform / "lab.tfvars.json").write_text("{}")
    (state.terraform / "terraform.tfstate").write_text("{}")
    return root


@pytest.fixture
def someone_elses(monkeypatch):
    """Make the files look another user's: this process pretends to be uid OTHER_UID + 1
    (no root needed, and nothing on the host changes owner)."""
    def as_other() -> None:
        monkeypatch.setattr(os, "geteuid", lambda: OTHER_UID + 1)
    return as_other


def test_a_lab_directory_of_another_user_is_never_destroyed_nor_its_terraform_run(
        tmp_path, someone_elses, monkeypatch):
    root = planted_lab(tmp_path / "theirs")
    ran: list[str] = []
    monkeypatch.setattr(terraform, "destroy", lambda st: ran.append("terraform destroy"))
    someone_elses()
    with pytest.raises(LabError, match="belongs to uid .* not to you"):
        cli.cmd_destroy_state(LabState(root))
    assert ran == [], "Terraform ran on a state another user wrote"
    with pytest.raises(LabError, match="belongs to uid"):
        lab.teardown(LabState(root))
    assert (root / "terraform" / "terraform.tfstate").exists() and (root / MARKER).exists()


def test_a_stale_lab_of_another_user_is_not_cleaned_up_by_provision(tmp_path, someone_elses,
                                                                     monkeypatch):
    root = planted_lab(tmp_path / "theirs")
    ran: list[str] = []
    monkeypatch.setattr(terraform, "destroy", lambda st: ran.append("terraform destroy"))
    someone_elses()
    config = LabConfig(lab="zz" + os.urandom(3).hex(), ssh_port_base=free_base(), state_dir=root)
    with pytest.raises(LabError, match="belongs to uid"):
        cli.prepare_state(config, LabState(root))
    assert ran == []


def test_an_empty_directory_of_another_user_is_not_claimed(tmp_path, someone_elses):
    """Before, claim() adopted it: its owner could swap `terraform/` in later."""
    (tmp_path / "empty").mkdir()
    someone_elses()
    with pytest.raises(LabError, match="belongs to uid"):
        LabState(tmp_path / "empty").claim()
    assert not (tmp_path / "empty" / MARKER).exists()


def test_a_directory_others_can_write_in_is_refused(tmp_path):
    root = planted_lab(tmp_path / "open")
    root.chmod(0o777)
    r = infra(root, "destroy")
    assert r.returncode == 1 and "can be written by other users" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert (root / "terraform").exists()
    root.chmod(0o700)
    (root / "terraform").chmod(0o777)
    with pytest.raises(LabError, match="terraform can be written by other users"):
        LabState(root).check_claimable()


def test_a_symlinked_terraform_state_is_refused(tmp_path):
    root = planted_lab(tmp_path / "lab")
    elsewhere = tmp_path / "elsewhere.tfstate"
    elsewhere.write_text("{}")
    (root / "terraform" / "terraform.tfstate").unlink()
    (root / "terraform" / "terraform.tfstate").symlink_to(elsewhere)
    with pytest.raises(LabError, match="is a symbolic link"):
        LabState(root).check_own()


def test_destroy_keeps_a_users_dot_files_and_removes_only_its_own_temporaries(tmp_path):
    state = LabState(tmp_path / "lab")
    state.claim()
    write_atomic(state.config_file, "{}")
    mine = [".keys.backup", ".lab.json.orig", ".inventory.json.swp", ".lab.json.abcdefgh",
            ".notes.abcdefgh.rxelab-tmp"]
    for name in mine:
        (state.root / name).write_text("the user's")
    # what a crash leaves of write_atomic: a temporary of the lab's own file
    left = state.root / ".lab.json.k3j9x0a_.rxelab-tmp"
    left.write_text("half a config")
    lab.teardown(state)
    assert not left.exists(), "the lab's own temporary stays behind"
    assert sorted(p.name for p in state.root.iterdir() if p.name != MARKER) == sorted(mine)
