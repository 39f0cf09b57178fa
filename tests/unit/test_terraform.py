"""The Terraform configuration is formatted, initialises offline and validates."""

import os
import shutil
import subprocess

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


def test_variable_validation_rejects_out_of_range_nodes(tmp_path):
    state = LabState(tmp_path)
    r = tf(state, "init", "-input=false", f"-backend-config=path={tmp_path}/tfstate")
    assert r.returncode == 0, r.stderr
    r = tf(state, "plan", "-input=false", "-no-color", "-var", "nodes=9")
    assert r.returncode != 0 and "whole number from 2 to 8" in r.stderr


def test_variables_carry_the_whole_lab_config(tmp_path):
    config = LabConfig(nodes=4, mem_mb=2048, lab="abc", state_dir=tmp_path)
    v = terraform.variables(config)
    assert (v["nodes"], v["mem_mb"], v["lab"], v["state_dir"]) == (4, 2048, "abc", str(tmp_path))
    declared = (terraform.TF_DIR / "variables.tf").read_text()
    for name in v:
        assert f'variable "{name}"' in declared


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
