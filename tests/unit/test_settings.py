"""The settings table is the one source: Terraform's variables, the Makefile's pass-through,
the CLI and the README must say what it says."""

import re

import pytest

from infra import settings, terraform
from infra.cli import parser
from infra.config import REPO, LabConfig
from infra.errors import LabError


def tf_variables() -> dict[str, str]:
    text = (REPO / "terraform" / "variables.tf").read_text()
    blocks = re.findall(r'variable "(\w+)" \{(.*?)\n\}', text, re.S)
    return dict(blocks)


@pytest.mark.parametrize("s", settings.LAB_SETTINGS, ids=lambda s: s.name)
def test_terraform_declares_each_lab_setting_with_the_same_default_and_range(s):
    body = tf_variables().get(s.field)
    assert body is not None, f'terraform/variables.tf lacks variable "{s.field}"'
    default = re.search(r"default\s*=\s*(.+)", body).group(1).strip().strip('"')
    assert default == s.default, f"{s.field}: Terraform default {default}, table {s.default}"
    if s.low is not None:
        assert f"var.{s.field} >= {s.low}" in body and f"var.{s.field} <= {s.high}" in body, body
    for choice in s.choices:
        assert f'"{choice}"' in body, f"{s.field}: Terraform does not allow {choice}"


def test_terraform_passes_every_lab_setting_to_the_configure_step():
    main = (REPO / "terraform" / "main.tf").read_text()
    for s in settings.LAB_SETTINGS:
        assert f"{s.field} = var.{s.field}" in re.sub(r"\s+", " ", main), s.field
        assert f'"{s.flag}", var.{s.field}' in main, s.flag
    assert set(terraform.variables(LabConfig())) == {s.field for s in settings.LAB_SETTINGS} | {
        "state_dir", "python"} == set(tf_variables())


def test_the_makefile_passes_every_setting_through():
    exported = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("export "):
            exported |= set(line.split()[1:])
    missing = {s.name for s in settings.SETTINGS} - exported
    assert not missing, f"Makefile does not export {missing}"


def test_the_readme_table_is_the_settings_table():
    assert settings.markdown_table() in (REPO / "README.md").read_text()


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
    assert settings.value("RXELAB_BOOT_TIMEOUT") == 77
    monkeypatch.setenv("RXELAB_BOOT_TIMEOUT", "soon")
    with pytest.raises(LabError, match="RXELAB_BOOT_TIMEOUT='soon' is not a whole number"):
        settings.value("RXELAB_BOOT_TIMEOUT")
    monkeypatch.delenv("RXELAB_BOOT_TIMEOUT")
    assert settings.value("RXELAB_BOOT_TIMEOUT") is None
