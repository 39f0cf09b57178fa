"""A lab's state directory is trusted only if the directories above it are too (issue 56,
item 1): whoever can write its parent can rename root's lab away and put a link to a lab of
their own in its place, after any check of the lab itself, and root's `destroy` then ran the
commands of their Terraform state. Shown here by a process of another user (`nobody`) doing
the swap; destroy and provision refuse before anything is read, run or written. Also: our
writes into the lab (Terraform's log and rc file) never follow a link planted at their path.
Each failed before: the lab under an open parent was destroyed, Terraform called."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import cli, lab, terraform
from infra import run as runner
from infra.config import REPO, LabConfig
from infra.errors import LabError
from infra.state import MARKER, LabState
from tests.unit.lab_helpers import free_base
from tests.unit.shared_tmp import dir_in_tmp, not_under_sudo  # noqa: F401 (autouse)
from tests.unit.strangers import run_as_stranger, stranger
from tests.unit.test_lab_state_trust import planted_lab

SWAP = """
import os, sys
lab, theirs = sys.argv[1], sys.argv[2]
os.rename(lab, lab + ".away")
os.mkdir(theirs)
os.symlink(theirs, lab)
swapped = os.path.realpath(lab) == theirs
os.unlink(lab)  # put everything back: the test shows it could be done, then asks root to act
os.rename(lab + ".away", lab)
os.rmdir(theirs)
print("swapped" if swapped else "not swapped")
"""



@pytest.fixture
def parent() -> Iterator[Path]:
    with dir_in_tmp("rxelab-parent-") as path:
        yield path


@pytest.fixture
def terraform_calls(monkeypatch) -> list[str]:
    """Terraform and every command faked: what would have run is recorded instead."""
    calls: list[str] = []
    for name in ("init", "apply", "destroy"):
        monkeypatch.setattr(terraform, name, lambda *a, name=name, **k: calls.append(name))
    monkeypatch.setattr(runner, "run_streaming", lambda argv, **k: calls.append(str(argv)))

    def run(argv, **kwargs):  # runner.run's stand-in
        calls.append(str(argv))
        return subprocess.CompletedProcess(argv, 0, "", "")
    monkeypatch.setattr(runner, "run", run)
    return calls


def tree(root: Path) -> list[tuple[str, int, int]]:
    """What is there, with its mode and last change: unchanged when nothing was written."""
    return sorted((str(p.relative_to(root)), p.lstat().st_mode, p.lstat().st_mtime_ns)
                  for p in root.rglob("*"))


@pytest.mark.parametrize("opened_by", ["mode 0777", "nobody's own"])
def test_a_lab_under_a_directory_another_user_can_write_is_not_touched(parent, opened_by,
                                                                       terraform_calls):
    who = stranger()
    root = planted_lab(parent / "lab")  # root's own lab; then its parent is opened
    if opened_by == "mode 0777":
        parent.chmod(0o777)
        said = f"{parent} can be written by other users (mode 0777, not sticky)"
    else:
        parent.chmod(0o755)
        os.chown(parent, who.pw_uid, who.pw_gid)
        said = f"{parent} belongs to uid {who.pw_uid}, neither you"
    proof = run_as_stranger(SWAP, str(root), str(parent / "theirs"))
    assert proof.stdout.strip() == "swapped", f"the attack was not possible: {proof.stderr}"
    before = tree(parent)
    config = LabConfig(lab="zz" + os.urandom(3).hex(), ssh_port_base=free_base(), state_dir=root)
    for act in (lambda: cli.cmd_destroy_state(LabState(root)), lambda: lab.teardown(LabState(root)),
                lambda: cli.prepare_state(config, LabState(root)), lambda: LabState(root).claim()):
        with pytest.raises(LabError) as refused:
            act()
        assert said in str(refused.value) and f"refusing to act in {root}" in str(refused.value)
    assert terraform_calls == [], "Terraform (or a command) ran in a lab another user can swap"
    assert tree(parent) == before, "something was written or removed"
    assert (root / MARKER).exists() and (root / "terraform" / "terraform.tfstate").exists()


def test_the_command_line_refuses_in_one_line(parent):
    root = planted_lab(parent / "lab")
    parent.chmod(0o777)
    r = subprocess.run([sys.executable, "-m", "infra", "--state-dir", str(root), "destroy"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: {parent} can be written by other users (mode 0777, not "
                               f"sticky): refusing to act in {root}"), r.stderr
    assert (root / "terraform" / "terraform.tfstate").exists()


def test_a_sticky_parent_anyone_can_write_is_fine_for_a_lab_of_ones_own(parent, terraform_calls):
    """As /tmp: others cannot rename or remove there what is not theirs."""
    parent.chmod(0o1777)
    state = LabState(parent / "lab")
    state.claim()
    state.check_own()
    (state.root / "lab.json").write_text("{}")
    cli.cmd_destroy_state(state)
    assert not state.root.exists()


def test_a_link_on_the_way_is_followed_and_what_it_leads_to_checked(parent, terraform_calls):
    open_dir = parent / "open"
    open_dir.mkdir()
    planted_lab(open_dir / "lab")
    open_dir.chmod(0o777)
    (parent / "via").symlink_to(open_dir)
    with pytest.raises(LabError, match=f"{open_dir} can be written by other users"):
        LabState(parent / "via" / "lab").check_own()
    # a link another user owns in a sticky directory: they could point it anywhere
    parent.chmod(0o1777)
    mine = parent / "mine"
    mine.mkdir(mode=0o700)
    LabState(mine / "lab").claim()
    made = run_as_stranger("import os, sys; os.symlink(sys.argv[1], sys.argv[2])",
                           str(mine), str(parent / "theirs"))
    assert made.returncode == 0, made.stderr
    with pytest.raises(LabError, match=r"theirs is a symbolic link of uid \d+, neither you"):
        LabState(parent / "theirs" / "lab").check_own()
    (parent / "ours").symlink_to(mine)  # the caller's own link to the caller's own lab: fine
    LabState(parent / "ours" / "lab").check_own()
    assert terraform_calls == []


def test_terraforms_log_and_rc_file_are_never_written_through_a_link(tmp_path, monkeypatch):
    state = LabState(tmp_path / "lab")
    state.claim()
    state.terraform.mkdir()
    precious = tmp_path / "precious"
    precious.write_text("not yours to overwrite")
    log = state.terraform / "last-run.log"
    log.symlink_to(precious)
    with pytest.raises(LabError, match="last-run.log is a symbolic link: refusing to write"):
        runner.run_streaming([sys.executable, "-c", "print('hello')"], prefix="", timeout=60,
                             log_file=log)
    assert precious.read_text() == "not yours to overwrite"
    rc = state.terraform / "terraformrc"
    rc.symlink_to(precious)
    monkeypatch.delenv("TF_CLI_CONFIG_FILE", raising=False)
    assert terraform._env(state)["TF_CLI_CONFIG_FILE"] == str(rc)  # where the rc file is written
    assert not rc.is_symlink() and "disable_checkpoint" in rc.read_text()
    assert precious.read_text() == "not yours to overwrite"


def test_under_sudo_the_invoking_users_directories_are_theirs_to_trust(parent, monkeypatch,
                                                                      terraform_calls):
    """`sudo make provision` in one's own checkout: that user is root already by sudo."""
    who = stranger()
    root = planted_lab(parent / "lab")
    parent.chmod(0o755)
    os.chown(parent, who.pw_uid, who.pw_gid)
    monkeypatch.setenv("SUDO_UID", "4321")
    with pytest.raises(LabError, match=f"belongs to uid {who.pw_uid}"):
        LabState(root).check_own()
    monkeypatch.setenv("SUDO_UID", str(who.pw_uid))
    LabState(root).check_own()
