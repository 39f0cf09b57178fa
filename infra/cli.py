"""Command line of the testbed: what the Makefile and Terraform call.

User commands: provision, destroy, status, ssh, inventory. Lifecycle steps that Terraform
runs (configure, image, network, node, wait) are commands too, so each can be run and
debugged alone. Errors reach the user as one message with a hint, never as a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

from infra import bootprofile, images, inventory, lab, lab_settings, network, status, terraform, vm
from infra import run as runner
from infra.config import DataNet, LabConfig, default_state_dir
from infra.errors import LabError
from infra.ssh import ssh_argv
from infra.state import LabState


def _config_args(p: argparse.ArgumentParser) -> None:
    for s in lab_settings.LAB_SETTINGS:
        p.add_argument(s.flag, dest=s.field, default=s.from_env(), metavar=s.name,
                       help=f"{s.help} (default {s.default}; or {s.name}=...)")


def _config(args: argparse.Namespace) -> LabConfig:
    return LabConfig.from_strings(
        state_dir=args.state_dir, **{s.field: getattr(args, s.field) for s in lab_settings.LAB_SETTINGS})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m infra", description=__doc__.split("\n\n")[0])
    p.add_argument("--state-dir", type=lambda s: Path(s).resolve(), default=default_state_dir(),
                   help=f"the lab's state directory (default: $RXELAB_STATE or {lab_settings.STATE_DIR}/)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every command run")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _config_args(sub.add_parser("provision", help="bring up the lab (Terraform apply)"))
    sub.add_parser("destroy", help="remove VMs, network, overlays and state (idempotent)")
    for name, helptext in (("status", "table of nodes"), ("inventory", "print the inventory")):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("--inventory", type=Path, default=os.environ.get("INVENTORY") or None,
                        help="an inventory file (default: the lab's)")
    sub.add_parser("boot-profile", help="where each node's boot went (the lab's nodes)")
    sp = sub.add_parser("ssh", help="a shell (or a command) on a node")
    sp.add_argument("node")
    sp.add_argument("--inventory", type=Path, default=os.environ.get("INVENTORY") or None)
    sp.add_argument("remote", nargs=argparse.REMAINDER, help="command to run instead of a shell")

    sub.add_parser("configure", help="(Terraform step) resolve and record the config provision wrote")
    sub.add_parser("image", help="(Terraform step) build or find the base image")
    sp = sub.add_parser("network", help="(Terraform step) the data network")
    sp.add_argument("action", choices=["up", "down"])
    sp = sub.add_parser("node", help="(Terraform step) start or stop one VM")
    sp.add_argument("action", choices=["up", "down"])
    sp.add_argument("index", type=int)
    sub.add_parser("wait", help="(Terraform step) wait until every node is ready")
    return p


def _inventory(args: argparse.Namespace, state: LabState) -> inventory.Inventory:
    return inventory.load(args.inventory or state.inventory_file)


def cmd_provision(args: argparse.Namespace) -> None:
    config = _config(args)
    state = LabState(config.state_dir)
    terraform.binary()  # Terraform or OpenTofu, before anything is touched
    runner.require(vm.QEMU, "qemu-img", "ssh", "ssh-keygen")
    kind, _ = images.resolve(config.image)
    if kind in images.RELEASES and not images.cached_debian(config.extras, kind):
        runner.require("mmdebstrap", "mkfs.ext4")
    if network.resolve(config.data_net) is DataNet.BRIDGE:
        runner.require("ip")
    prepare_state(config, state)
    started = time.monotonic()
    # `kill` or a closed terminal ends a provision as Ctrl-C does: Terraform is interrupted
    # and waited for, and everything it started is removed (it would be orphaned otherwise)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, lambda signum, frame: _hang_up(state.logs / "provision.log"))
    try:
        terraform.apply(config, state)
    except KeyboardInterrupt:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        print("\ninterrupted: removing everything this provision started ...", flush=True)
        _teardown_after_failure(state)
        raise LabError("provisioning was interrupted; nothing is left running") from None
    except LabError as e:
        print("provisioning failed: removing everything it started ...", flush=True)
        _teardown_after_failure(state)
        raise LabError(f"provisioning failed:\n{e}",
                       hint=f"serial logs are kept in {state.logs}; `make destroy` removes them") from None
    elapsed = time.monotonic() - started
    inv = inventory.load(state.inventory_file)
    status.show(status.collect(inv, _running(state)))
    print(f"lab ready in {elapsed:.0f} s. Next: `make ssh NODE={inv.hosts[0].name}`, "
          f"`make status`, `make destroy`. Inventory: {state.inventory_file}")


def _interrupt(signum: int, frame: object) -> None:
    # one SIGTERM is one interrupt: a second (the group's, after make passed one on to its
    # child) would cut Terraform's interrupt short, as a second Ctrl-C does on purpose
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _hang_up(log: Path) -> None:
    """The terminal closed: the clean-up must not die writing to it."""
    runner.detach_from_terminal(log)
    raise KeyboardInterrupt


def prepare_state(config: LabConfig, state: LabState) -> None:
    """Before Terraform: nothing of another lab in the way, a stale lab of this directory gone
    (it removes its own marker with it), and the directory claimed - in that order."""
    lab.preflight(config, state)
    _replace_stale_lab(state)
    state.claim()


def _replace_stale_lab(state: LabState) -> None:
    """A lab whose VMs are gone (host rebooted, killed by hand) is torn down, not trusted."""
    state.check_own()
    if not terraform.has_state(state) or not state.config_file.exists():
        return
    config = state.load_config()
    stopped = [n.name for n in config.all_nodes() if not vm.is_running(state, n)]
    if stopped:
        print(f"the previous lab is not running ({', '.join(stopped)} stopped): removing it first")
        cmd_destroy_state(state)


def _teardown_after_failure(state: LabState) -> None:
    if terraform.has_state(state):
        try:
            terraform.destroy(state)
        except (LabError, KeyboardInterrupt) as e:
            print(f"terraform destroy did not finish ({e}); removing by pid files", flush=True)
    lab.teardown(state, keep_logs=True)


def _running(state: LabState) -> dict[str, bool]:
    if not state.config_file.exists():
        return {}
    config = state.load_config()
    return {n.name: vm.is_running(state, n) for n in config.all_nodes()}


def cmd_destroy(state: LabState) -> None:
    """A destroy is the clean-up itself: `kill` (SIGTERM, as a cancelled CI job or a test
    session's teardown sends it to every process) or a closed terminal lets it finish. Ended
    there, it would leave Terraform destroying on its own in its session, and the namespace,
    taps and files after it in place. Ctrl-C still stops it; the ignored SIGTERM is also
    Terraform's and the node steps'."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, lambda signum, frame: runner.detach_from_terminal())
    cmd_destroy_state(state)


def cmd_destroy_state(state: LabState) -> None:
    had_state = state.root.exists()
    state.check_own()  # before Terraform runs anything its state records
    if had_state and not state.is_lab():
        lab.teardown(state)  # refuses, naming why, before Terraform is asked anything
    if terraform.has_state(state):
        try:
            terraform.destroy(state)
        except LabError as e:
            print(f"terraform destroy failed ({e}); removing by pid files", flush=True)
    removed = lab.teardown(state)
    if removed:
        print("removed: " + ", ".join(removed))
    print("lab destroyed" if had_state else "nothing to destroy")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # A lab's files hold the keys its nodes trust: private from their first byte. The image
    # build keeps the usual mask: it makes a root file system for every user of the guest.
    os.umask(0o022 if args.command == "image" else 0o077)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(message)s")
    state = LabState(args.state_dir)
    try:
        match args.command:
            case "provision":
                cmd_provision(args)
            case "destroy":
                cmd_destroy(state)
            case "status":
                status.show(status.collect(_inventory(args, state),
                                           None if args.inventory else _running(state)))
            case "boot-profile":
                if not state.inventory_file.exists():
                    raise LabError(f"no lab is provisioned in {state.root}",
                                   hint="`make provision` first; the profile reads its nodes")
                bootprofile.show(bootprofile.collect(
                    list(inventory.load(state.inventory_file).hosts), state))
            case "inventory":
                sys.stdout.write(_inventory(args, state).to_json())
            case "ssh":
                host = _inventory(args, state).host(args.node)
                remote = [a for a in args.remote if a != "--"]
                argv_ = ssh_argv(host, *remote, tty=not remote and sys.stdin.isatty())
                os.execvp(argv_[0], argv_)
            case "configure":
                lab.configure(state.load_request(), state)
            case "image":
                lab.prepare_image(state)
            case "network":
                if args.action == "up":
                    network.up(state.load_config(), state)
                elif state.config_file.exists():
                    network.down(state.load_config(), state)
            case "node":
                (lab.node_up if args.action == "up" else lab.node_down)(state, args.index)
            case "wait":
                lab.wait(state)
    except LabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0
