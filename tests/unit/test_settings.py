"""The settings table is the one source: the CLI, LabConfig, the experiment specs' MTU check,
the Makefile's pass-through and help and the lab page (docs/lab.md) say what it says, and Terraform is not
given the settings at all."""

import re

import pytest

from infra import lab_settings, terraform
from infra.cli import parser
from infra.config import REPO, LabConfig
from infra.errors import LabError
from infra.state import LabState


def tf_variables() -> dict[str, str]:
    text = (REPO / "terraform" / "variables.tf").read_text()
    blocks = re.findall(r'variable "(\w+)" \{(.*?)\n\}', text, re.S)
    return dict(blocks)


def test_terraform_is_given_the_state_directory_and_the_configs_digest_not_the_settings(tmp_path):
    """The lab's settings do not travel through Terraform, so Terraform neither restates nor
    checks them: it is given where the lab's config is, the config's digest and the Python."""
    declared = set(tf_variables())
    assert declared == {"state_dir", "config_digest", "python"}
    assert set(terraform.variables(LabState(tmp_path), "d1gest")) == declared
    tf = "\n".join(p.read_text() for p in sorted((REPO / "terraform").glob("*.tf")))
    for s in lab_settings.LAB_SETTINGS:
        assert f"var.{s.field}" not in tf and f'"{s.flag}"' not in tf, s.field
        if s.low is not None:
            assert f">= {s.low}" not in tf and f"<= {s.high}" not in tf, s.name
    main = (REPO / "terraform" / "main.tf").read_text()
    assert f'"${{var.state_dir}}/{LabState(tmp_path).request_file.name}"' in main, \
        "Terraform reads the number of nodes from the config file provision writes"
    assert "triggers_replace = var.config_digest" in main


def test_the_makefile_passes_every_setting_through():
    exported = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("export "):
            exported |= set(line.split()[1:])
    missing = {s.name for s in lab_settings.SETTINGS} - exported
    assert not missing, f"Makefile does not export {missing}"


def test_the_lab_page_s_table_is_the_settings_table():
    assert lab_settings.markdown_table() in (REPO / "docs" / "lab.md").read_text()


def test_cli_flags_and_defaults_come_from_the_table(monkeypatch):
    monkeypatch.setenv("MTU", "1500")
    args = parser().parse_args(["provision"])
    assert args.mtu == "1500" and args.nodes == "3"


def test_lab_settings_parse_with_clear_errors():
    assert LabConfig.from_strings(mtu="1500").mtu == 1500
    with pytest.raises(LabError, match=r"MTU=99999 is out of range") as e:
        LabConfig.from_strings(mtu="99999")
    assert e.value.hint == "use 1280..9000"
    with pytest.raises(LabError, match="unknown lab settings"):
        LabConfig.from_strings(colour="red")


def test_host_settings_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("RXELAB_BOOT_TIMEOUT", "77")
    assert lab_settings.value("RXELAB_BOOT_TIMEOUT") == 77
    monkeypatch.setenv("RXELAB_BOOT_TIMEOUT", "soon")
    with pytest.raises(LabError, match="RXELAB_BOOT_TIMEOUT='soon' is not a whole number"):
        lab_settings.value("RXELAB_BOOT_TIMEOUT")
    monkeypatch.delenv("RXELAB_BOOT_TIMEOUT")
    assert lab_settings.value("RXELAB_BOOT_TIMEOUT") == 3600, "its default"
    monkeypatch.setenv("RXELAB_STALL", "5")
    with pytest.raises(LabError, match="RXELAB_STALL=5 is out of range"):
        lab_settings.value("RXELAB_STALL")
    monkeypatch.delenv("RXELAB_CACHE", raising=False)
    assert lab_settings.value("RXELAB_CACHE") is None, "no default: None"


def test_lab_config_takes_its_defaults_from_the_table(tmp_path):
    config = LabConfig(state_dir=tmp_path)
    for s in lab_settings.LAB_SETTINGS:
        assert getattr(config, s.field) == s.convert(s.default), s.name
    assert config == LabConfig.from_strings(state_dir=tmp_path)


def test_each_lab_setting_is_checked_when_a_config_is_made(tmp_path):
    """Setting.check is the one check: a config made directly, or read back from a file
    someone edited, is refused as one typed by hand is."""
    with pytest.raises(LabError, match=r"MTU=99999 is out of range"):
        LabConfig(mtu=99999, state_dir=tmp_path)
    with pytest.raises(LabError, match=r"unknown IMAGE 'fedora'"):
        LabConfig(image="fedora", state_dir=tmp_path)  # type: ignore[arg-type]
    edited = LabConfig(state_dir=tmp_path).to_json().replace('"nodes": 3', '"nodes": 99')
    with pytest.raises(LabError, match=r"NODES=99 is out of range") as e:
        LabConfig.from_json(edited)
    assert e.value.hint == "use 2..8"


ONE_SOURCE = r"""
import json, sys
from infra import lab_settings

# A different MTU row in the table, before anything else reads it.
mtu = lab_settings.BY_NAME["MTU"]
for name, value in (("default", "4000"), ("low", 2000), ("high", 8000)):
    object.__setattr__(mtu, name, value)

from infra.config import LabConfig
from infra.errors import LabError
from experiments import spec

def spec_accepts(value):
    doc = {"name": "t", "runs": [{"app": "rxelab", "op": "alltoall", "algorithms": ["pairwise"],
                                  "nodes": [2], "sizes": [8], "mtu": [value]}]}
    try:
        spec.parse(doc)
    except spec.SpecError as err:
        return str(err)
    return "accepted"

def lab_accepts(value):
    try:
        return LabConfig.from_strings(mtu=value, state_dir="/nonexistent").mtu
    except LabError as err:
        return f"{err}; {err.hint}"

print(json.dumps({
    "default": LabConfig(state_dir="/nonexistent").mtu,
    "lab": [lab_accepts(v) for v in ("1500", "3000", "9000")],
    "spec": [spec_accepts(v) for v in (1500, 3000, 9000)],
    "help": lab_settings.make_help(),
    "table": lab_settings.markdown_table(),
}))
"""


def test_the_mtu_range_and_default_have_one_source(tmp_path):
    """Changing the MTU's row in infra/lab_settings.py changes LabConfig's default, its check,
    the experiment specs' check, `make help` and the lab page's table: nothing restates them."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "lib"), str(REPO)])}
    r = subprocess.run([sys.executable, "-c", ONE_SOURCE], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["default"] == 4000
    assert got["lab"][1] == 3000
    for refused in (got["lab"][0], got["lab"][2]):
        assert "is out of range" in refused and "use 2000..8000" in refused, refused
    assert got["spec"][1] == "accepted"
    for refused in (got["spec"][0], got["spec"][2]):
        assert "runs[0].mtu: must be from 2000 to 8000" in refused, refused
    assert "MTU=4000" in got["help"] and "| `MTU` | 4000 |" in got["table"] \
        and "2000..8000" in got["table"]


def test_the_spec_format_says_the_tables_mtu_range():
    """experiments/spec/__init__.py's description of the format names the range the check takes from
    the table (a description is not a check, but it must not drift either)."""
    from experiments import spec

    low, high = lab_settings.BY_NAME["MTU"].bounds
    assert spec.MTU_RANGE == (low, high)
    assert f"{low}..{high}" in (spec.__doc__ or "")


def test_the_state_directory_is_named_once():
    """`.lab` is spelled in infra/lab_settings.py alone: the code, the Makefile and the help texts
    take it from there, and Terraform is given the directory."""
    spelled = re.compile(r"(?<![\w.])\.lab\b(?!\.)")
    files = [*(REPO / "infra").rglob("*.py"), *(REPO / "experiments").glob("*.py"),
             *(REPO / "terraform").glob("*.tf"), REPO / "Makefile", REPO / "fabfile.py"]
    found = [f"{p.relative_to(REPO)}:{n}" for p in files
             for n, line in enumerate(p.read_text().splitlines(), 1) if spelled.search(line)]
    assert found == ["infra/lab_settings.py:" + str(next(
        n for n, line in enumerate((REPO / "infra/lab_settings.py").read_text().splitlines(), 1)
        if line.startswith("STATE_DIR = ")))]
    assert lab_settings.STATE_DIR == ".lab"
    assert f"(default {lab_settings.STATE_DIR}/)" in lab_settings.BY_NAME["RXELAB_STATE"].help


def test_make_help_shows_the_tables_defaults():
    import subprocess

    r = subprocess.run(["make", "-s", "help", "PY=" + __import__("sys").executable], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"# boot the lab ({lab_settings.make_help()})" in r.stdout
