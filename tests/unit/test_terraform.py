"""The Terraform configuration is formatted, initialises offline, validates, and replaces the lab
when (and only when) the config provision wrote changes."""

import os
import shutil
import subprocess
import sys

import pytest

from infra import terraform
from infra.config import LabConfig
from infra.state import LabState

pytestmark = pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform not installed")


def tf(state, *args):
    env = {**os.environ, **terraform._env(state)}
    return subprocess.run(["terraform", f"-chdir={terraform.TF_DIR}", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_fmt_is_clean(tmp_path):
    r = tf(LabState(tmp_path), "fmt", "-check", "-diff", "-recursive")
    assert r.returncode == 0, r.stdout + r.stderr


def test_init_offline_and_validate(tmp_path):
    state = LabState(tmp_path)
    r = tf(state, "init", "-backend=false", "-input=false", "-no-color")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "registry" not in r.stdout.lower(), "only built-in providers: no registry needed"
    r = tf(state, "validate", "-no-color")
    assert r.returncode == 0 and "Success" in r.stdout, r.stdout + r.stderr


def test_variables_are_where_the_config_is_and_its_digest(tmp_path):
    """`make provision` writes the lab's config once, in its state directory; Terraform is
    given that directory and the digest of its settings, which changes with any of them and
    with nothing else (where the state lives, say: a moved lab is not rebuilt)."""
    state = LabState(tmp_path)
    config = LabConfig(nodes=4, mem_mb=2048, lab="abc", state_dir=tmp_path)
    digest = state.save_request(config)
    assert state.load_request() == config
    elsewhere = tmp_path / "moved"
    elsewhere.mkdir()
    assert LabState(elsewhere).save_request(LabConfig(nodes=4, mem_mb=2048, lab="abc",
                                                      state_dir=elsewhere)) == digest
    v = terraform.variables(state, digest)
    assert v == {"state_dir": str(tmp_path), "config_digest": digest, "python": sys.executable}
    declared = (terraform.TF_DIR / "variables.tf").read_text()
    for name in v:
        assert f'variable "{name}"' in declared
    assert state.save_request(LabConfig(nodes=4, mem_mb=2048, lab="abc", mtu=1500,
                                        state_dir=tmp_path)) != digest


FAKE_PYTHON = """#!/bin/sh
# Stands in for `python -m infra --state-dir DIR STEP...`: records the step, and writes the
# inventory the wait step would.
dir="$4"; shift 4
echo "$*" >> "$dir/steps.log"
[ "$1" = wait ] && echo '{"nodes": []}' > "$dir/inventory.json"
exit 0
"""


def test_a_changed_config_replaces_the_lab_and_an_unchanged_one_nothing(tmp_path):
    """Terraform, run as provision and destroy run it but with fake steps: the nodes it makes
    are the config file's, the same digest changes nothing, another digest replaces every
    step, and a lab whose config file is gone is still destroyed."""
    state = LabState(tmp_path / "lab")
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    r = tf(state, "init", "-input=false", "-no-color",
           f"-backend-config=path={tmp_path}/terraform.tfstate")
    assert r.returncode == 0, r.stdout + r.stderr

    def run(command, config=None):
        digest = state.save_request(config) if config else ""
        (state.root / "steps.log").write_text("")
        r = tf(state, command, "-input=false", "-auto-approve", "-no-color",
               "-var", f"state_dir={state.root}", "-var", f"python={fake}",
               "-var", f"config_digest={digest}")
        assert r.returncode == 0, r.stdout + r.stderr
        return sorted((state.root / "steps.log").read_text().splitlines())

    assert run("apply", LabConfig(nodes=2, state_dir=state.root)) == [
        "configure", "image", "network up", "node up 1", "node up 2", "wait"]
    assert run("apply", LabConfig(nodes=2, state_dir=state.root)) == []
    assert run("apply", LabConfig(nodes=3, mtu=1500, state_dir=state.root)) == [
        "configure", "image", "network down", "network up", "node down 1", "node down 2",
        "node up 1", "node up 2", "node up 3", "wait"]
    state.request_file.unlink()
    assert run("destroy") == ["network down", "node down 1", "node down 2", "node down 3"]


def test_output_is_relayed_without_plan_detail_or_provisioner_noise():
    lines = [
        "Terraform used the selected providers to generate the following execution",
        '  + resource "terraform_data" "lab" {',
        "Plan: 7 to add, 0 to change, 0 to destroy.",
        "Changes to Outputs:",
        "  + inventory      = (known after apply)",
        "terraform_data.lab: Creating...",
        'terraform_data.lab (local-exec): Executing: ["/bin/sh" "-c" "..."]',
        "terraform_data.node[0] (local-exec): node1: started",
        "terraform_data.ready: Still creating... [10s elapsed]",
        "Apply complete! Resources: 7 added, 0 changed, 0 destroyed.",
        "Outputs:",
        'inventory = {',
    ]
    relay = terraform.Relay()
    shown = [out for line in lines if (out := relay(line)) is not None]
    assert shown == [
        "Plan: 7 to add, 0 to change, 0 to destroy.",
        "terraform_data.lab: Creating...",
        "  node1: started",
        "Apply complete! Resources: 7 added, 0 changed, 0 destroyed.",
    ]
