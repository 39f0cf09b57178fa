"""Terraform or OpenTofu, whichever is there (issue 53, item 5): infra runs `tofu` when no new
enough `terraform` is on the PATH, and with neither both `make check` and provisioning fail
first, naming both, before anything is installed or touched."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from infra import terraform
from infra.errors import LabError
from tests import tofu_standin

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_choice():
    terraform.binary.cache_clear()
    yield
    terraform.binary.cache_clear()


def fake_terraform(bin_dir: Path, version: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    tf = bin_dir / "terraform"
    tf.write_text(f"#!/bin/sh\n[ \"$2\" = -json ] && echo '{{\"terraform_version\": \"{version}\"}}' "
                  f"|| echo 'Terraform v{version}'\n")
    tf.chmod(0o755)


def test_with_only_tofu_on_the_path_infra_runs_tofu(tmp_path, monkeypatch):
    log = tmp_path / "tofu.log"
    monkeypatch.setenv("PATH", tofu_standin.only_tofu_path(tmp_path, log))
    assert shutil.which("terraform") is None
    assert terraform.binary() == "tofu"
    state_dir = tmp_path / "state"
    from infra.state import LabState

    terraform.init(LabState(state_dir))  # a real `init` of our configuration, through tofu
    assert "init -input=false" in log.read_text().replace(f"-chdir={terraform.TF_DIR} ", "")


def test_an_old_terraform_gives_way_to_tofu_and_a_new_one_is_preferred(tmp_path, monkeypatch):
    real = shutil.which("terraform") or "/bin/false"
    tofu_standin.standin(tmp_path / "tofu-bin", real)
    fake_terraform(tmp_path / "old", "1.3.9")
    monkeypatch.setenv("PATH", f"{tmp_path / 'old'}:{tmp_path / 'tofu-bin'}:/usr/bin:/bin")
    assert terraform.binary() == "tofu"
    terraform.binary.cache_clear()
    fake_terraform(tmp_path / "new", "1.11.4")
    monkeypatch.setenv("PATH", f"{tmp_path / 'new'}:{tmp_path / 'tofu-bin'}:/usr/bin:/bin")
    assert terraform.binary() == "terraform"


def test_with_neither_the_lab_is_refused_naming_both(tmp_path, monkeypatch):
    fake_terraform(tmp_path / "old", "1.3.9")
    monkeypatch.setenv("PATH", f"{tmp_path / 'old'}:/usr/bin:/bin")
    with pytest.raises(LabError) as e:
        terraform.binary()
    assert "neither Terraform >= 1.4 nor OpenTofu >= 1.6" in e.value.message
    assert "terraform 1.3.9" in e.value.message and "make check" in (e.value.hint or "")


def check_host(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "infra" / "check-host.sh"), *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PATH": path})


@pytest.mark.slow
def test_make_check_says_what_is_missing_in_seconds_and_install_deps_stops_there(tmp_path):
    no_tf = tofu_standin.path_without("tofu", tmp_path / "a", tofu_standin.path_without(
        "terraform", tmp_path / "b"))
    r = check_host(no_tf)
    assert r.returncode == 1, r.stdout
    assert "MISSING  Terraform >= 1.4 or OpenTofu >= 1.6" in r.stdout
    assert "nothing was installed" in r.stdout
    with_tofu = tofu_standin.only_tofu_path(tmp_path / "c")
    r = check_host(with_tofu)
    assert r.returncode == 0 and f"ok       tofu {tofu_standin.VERSION} (OpenTofu)" in r.stdout, r.stdout
    # install-deps.sh runs the check before apt and pip: with nothing to run infra with, it
    # ends there, having installed nothing (it would otherwise start with apt-get)
    r = subprocess.run(["bash", str(REPO / "infra" / "install-deps.sh")], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PATH": no_tf}, cwd=tmp_path)
    assert r.returncode == 1 and "MISSING  Terraform" in r.stdout, r.stdout + r.stderr
    assert "deps: installing" not in r.stdout and "pip" not in r.stdout + r.stderr
