"""Driving Terraform (or OpenTofu, its open drop-in: whichever is installed) for
`make provision` / `make destroy`.

Terraform owns the lifecycle (terraform/*.tf); this module only runs it, keeps its state and
plugin directory inside the lab's state directory, never lets it phone home
(CHECKPOINT_DISABLE), and relays its output without the provisioner noise.

The lab's config does not travel through Terraform: `apply` writes it once, as a file in the
state directory (LabState.request_file), and Terraform is given that directory, the file's
digest (a changed config replaces the lab) and the Python that runs the steps. The steps read
the config from the state directory.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from infra import run as runner
from infra.config import REPO, LabConfig
from infra.errors import LabError
from infra.state import LabState, mkdir_private, write_atomic

TF_DIR = REPO / "terraform"
NOISE = re.compile(r"\(local-exec\): Executing: |Still creating\.\.\.|Still destroying\.\.\.|"
                   r"^\s*$|Provisioning with 'local-exec'")
PREFIX = re.compile(r"^terraform_data\.[\w\[\]\d]+ \(local-exec\): ")


# Every step Terraform runs has deadlines of its own that follow progress (the image build, the
# boot); this only bounds Terraform itself, past the longest those allow.
APPLY_CAP_S = 6 * 3600
# terraform_data came with Terraform 1.4; OpenTofu has it from its first release, 1.6.
LEAST = {"terraform": (1, 4), "tofu": (1, 6)}
INSTALL_HINT = ("install Terraform >= 1.4 or OpenTofu >= 1.6 (`tofu`), a single binary on the PATH "
                "(neither is in Debian's or Ubuntu's archive); `make check` says what else is missing")


@functools.cache
def binary() -> str:
    """The Terraform to run: `terraform` if it is new enough, else `tofu`."""
    seen = []
    for name, least in LEAST.items():
        if shutil.which(name) is None:
            continue
        r = runner.run([name, "version", "-json"], check=False, timeout=120)
        try:
            text = json.loads(r.stdout)["terraform_version"]  # OpenTofu says it the same way
            version = tuple(int(x) for x in text.split(".")[:2])
        except (ValueError, KeyError, TypeError):
            seen.append(f"{name} (its version unreadable)")
            continue
        if version >= least:
            return name
        seen.append(f"{name} {text}")
    found = f" (found: {', '.join(seen)})" if seen else ""
    raise LabError(f"neither Terraform >= 1.4 nor OpenTofu >= 1.6 is installed{found}",
                   hint=INSTALL_HINT)


def variables(state: LabState, config_digest: str) -> dict[str, object]:
    """All Terraform is given (terraform/variables.tf): where the lab's state and config
    live, the config's digest, and which Python runs the steps."""
    return {"state_dir": str(state.root), "config_digest": config_digest,
            "python": sys.executable}


def _env(state: LabState) -> dict[str, str]:
    env = {
        "CHECKPOINT_DISABLE": "1",  # no version check against an outside server
        "TF_IN_AUTOMATION": "1",
        "TF_INPUT": "0",
        "TF_DATA_DIR": str(state.terraform / "data"),
    }
    cli_config = os.environ.get("TF_CLI_CONFIG_FILE")
    if cli_config is None or not Path(cli_config).exists():
        rc = state.terraform / "terraformrc"
        write_atomic(rc, "disable_checkpoint = true\n")
        env["TF_CLI_CONFIG_FILE"] = str(rc)
    return env


class Relay:
    """Shows what a user follows (each step and what our commands say), not the plan's or the
    outputs' detail: those stay in the log file (`last-run.log`) and in `terraform output`."""

    SKIP_FROM = ("Terraform used the selected providers", "Changes to Outputs:", "Outputs:")
    SKIP_UNTIL = ("Plan: ", "terraform_data.", "Apply complete!", "Destroy complete!")

    def __init__(self) -> None:
        self.skipping = False

    def __call__(self, line: str) -> str | None:
        if line.startswith(self.SKIP_FROM):
            self.skipping = True
            return None
        if self.skipping and not line.startswith(self.SKIP_UNTIL):
            return None
        self.skipping = False
        if NOISE.search(line):
            return None
        return PREFIX.sub("  ", line)


def _quiet(line: str) -> str | None:
    return None


def _terraform(state: LabState, *args: str, timeout: float, interrupt_grace: float = 30,
               relay: Callable[[str], str | None] | None = None) -> None:
    runner.run_streaming(
        [binary(), f"-chdir={TF_DIR}", *args],
        prefix="",
        timeout=timeout,
        log_file=state.terraform / "last-run.log",
        env=_env(state),
        transform=relay or Relay(),
        interrupt_grace=interrupt_grace,
    )


def init(state: LabState) -> None:
    mkdir_private(state.terraform)
    _terraform(state, "init", "-input=false", "-no-color",
               f"-backend-config=path={state.terraform / 'terraform.tfstate'}", timeout=300,
               relay=_quiet)


def vars_file(state: LabState) -> Path:
    return state.terraform / "lab.tfvars.json"


def apply(config: LabConfig, state: LabState) -> None:
    init(state)
    digest = state.save_request(config)
    write_atomic(vars_file(state), json.dumps(variables(state, digest), indent=2) + "\n")
    _terraform(state, "apply", "-input=false", "-auto-approve", "-no-color",
               f"-var-file={vars_file(state)}", timeout=APPLY_CAP_S)


def has_state(state: LabState) -> bool:
    return vars_file(state).exists() and (state.terraform / "terraform.tfstate").exists()


def destroy(state: LabState) -> None:
    init(state)
    _terraform(state, "destroy", "-input=false", "-auto-approve", "-no-color",
               f"-var-file={vars_file(state)}", timeout=900)

