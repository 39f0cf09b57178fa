"""Choosing the accelerator. KVM is used only when it really runs a stock guest kernel: on
some hosts /dev/kvm exists but is a paravirtual hypervisor (PVM) under which stock kernels
hang silently. So ACCEL=auto boots the image's kernel once under KVM with a short deadline,
and caches the verdict per host kernel, qemu and guest kernel.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

from infra import owned_paths
from infra import run as runner
from infra.config import Accel
from infra.errors import LabError
from infra.images import BaseImage
from infra.state import write_atomic

PROBE_TIMEOUT_S = 25.0
KVM_DEVICE = Path("/dev/kvm")
# Printed once the kernel has finished its own initialisation: proof that it really ran.
DONE_MARKERS = ("Kernel panic", "Freeing unused kernel")


def cpu_args(accel: Accel) -> list[str]:
    if accel is Accel.KVM:
        return ["-accel", "kvm", "-cpu", "host"]
    # Measured: qemu64 with these flags boots ~20 % faster and imports Python ~1.7x faster
    # than `-cpu max` under TCG, and glibc/numpy still find SSE4.2.
    return [
        "-accel", "tcg,thread=multi",
        "-cpu", "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt,+pclmulqdq",
    ]  # fmt: skip


def resolve(requested: Accel, image: BaseImage) -> tuple[Accel, str]:
    if requested is Accel.TCG:
        return Accel.TCG, "accel: tcg (asked for)"
    usable, why = kvm_usable(image)
    if requested is Accel.KVM:
        if not usable:
            raise LabError(f"ACCEL=kvm, but KVM cannot run this guest: {why}",
                           hint="use ACCEL=auto or ACCEL=tcg")
        return Accel.KVM, "accel: kvm (asked for, and it boots the guest kernel)"
    if usable:
        return Accel.KVM, "accel: kvm (ACCEL=auto: it boots the guest kernel)"
    return Accel.TCG, f"accel: tcg (ACCEL=auto: {why})"


def kvm_usable(image: BaseImage) -> tuple[bool, str]:
    if not KVM_DEVICE.exists():
        return False, f"{KVM_DEVICE} does not exist"
    if not os.access(KVM_DEVICE, os.R_OK | os.W_OK):
        return False, f"{KVM_DEVICE} is not accessible to this user (add it to the kvm group)"
    key = _probe_key(image)
    cache = owned_paths.cache_subdir() / "accel-probe.json"  # checked all the way up
    if os.path.lexists(cache):  # as is the file: its verdicts choose how root runs qemu
        owned_paths.check_owned_file(cache, "trust it", hint=owned_paths.CACHE_HINT)
    try:
        known = json.loads(cache.read_text())
    except (FileNotFoundError, ValueError):
        known = {}
    if key in known:
        return bool(known[key]["kvm"]), str(known[key]["why"]) + " (cached)"
    print(f"accel: probing KVM with the guest kernel ({PROBE_TIMEOUT_S:.0f} s at most)", flush=True)
    usable, why = probe(image)
    known[key] = {"kvm": usable, "why": why}
    write_atomic(cache, json.dumps(known, indent=2) + "\n")
    return usable, why


def probe(image: BaseImage, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="rxelab-kvm-probe-") as tmp:
        serial = Path(tmp) / "serial.log"
        argv = [
            "qemu-system-x86_64",
            "-accel", "kvm", "-cpu", "host", "-m", "256", "-smp", "1",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-serial", f"file:{serial}",
        ]  # fmt: skip
        if image.direct_boot:
            # No root device and no initrd: a kernel that runs panics within a second.
            argv += ["-kernel", str(image.kernel), "-append", "console=ttyS0 panic=-1"]
        else:
            argv += ["-drive", f"file={image.disk},format={image.disk_format},if=virtio,snapshot=on"]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
        except FileNotFoundError:
            raise runner.missing_program("qemu-system-x86_64") from None
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                text = serial.read_text(errors="replace") if serial.exists() else ""
                if any(m in text for m in DONE_MARKERS):
                    return True, "the guest kernel boots under KVM"
                if proc.poll() is not None:
                    err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
                    return False, "qemu could not start with KVM: " + (err[-1] if err else "no reason given")
                time.sleep(0.25)
            return False, f"/dev/kvm is present but the guest kernel did not boot in {timeout:.0f} s"
        finally:
            proc.kill()
            proc.wait()


def _probe_key(image: BaseImage) -> str:
    target = image.kernel if image.direct_boot else image.disk
    assert target is not None
    st = target.stat()
    qemu = runner.run(["qemu-system-x86_64", "--version"], timeout=30).stdout.splitlines()[0]
    raw = f"{platform.release()}|{qemu}|{target}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]
