"""The KVM decision, against fake qemu programs that behave like the three cases we meet:
a guest kernel that boots, one that hangs silently (PVM), and qemu refusing KVM."""

import os
import stat

import pytest

from infra import accel
from infra.config import Accel, Image
from infra.errors import LabError
from infra.images import BaseImage

FAKES = {
    "boots": 'for a in "$@"; do case $a in file:*) f=${a#file:};; esac; done\n'
             'echo "Linux version 6.1" > "$f"; sleep 0.3; echo "Kernel panic - not syncing" >> "$f"\n'
             "sleep 30\n",
    "hangs": "sleep 30\n",
    "refuses": 'echo "qemu-system-x86_64: failed to initialize kvm: Permission denied" >&2; exit 1\n',
}


@pytest.fixture
def fake_qemu(tmp_path, monkeypatch):
    def install(behaviour):
        bindir = tmp_path / "bin"
        bindir.mkdir(exist_ok=True)
        exe = bindir / "qemu-system-x86_64"
        version = '[ "$1" = --version ] && { echo "QEMU emulator version 9.9 (fake)"; exit 0; }\n'
        exe.write_text("#!/bin/sh\n" + version + FAKES[behaviour])
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")

    return install


@pytest.fixture
def image(tmp_path):
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"kernel")
    return BaseImage(Image.DEBIAN12, tmp_path / "disk.raw", "raw", kernel, tmp_path / "initrd")


def test_probe_sees_a_booting_kernel(fake_qemu, image):
    fake_qemu("boots")
    assert accel.probe(image, timeout=10) == (True, "the guest kernel boots under KVM")


def test_probe_gives_up_on_a_silent_hang(fake_qemu, image):
    fake_qemu("hangs")
    usable, why = accel.probe(image, timeout=1.5)
    assert not usable and "did not boot in 2 s" in why


def test_probe_reports_why_qemu_refused(fake_qemu, image):
    fake_qemu("refuses")
    usable, why = accel.probe(image, timeout=10)
    assert not usable and "Permission denied" in why


def test_auto_falls_back_to_tcg_and_kvm_demand_fails_clearly(monkeypatch, image):
    monkeypatch.setattr(accel, "kvm_usable", lambda img: (False, "it hangs"))
    assert accel.resolve(Accel.AUTO, image) == (Accel.TCG, "accel: tcg (ACCEL=auto: it hangs)")
    with pytest.raises(LabError, match="KVM cannot run this guest: it hangs"):
        accel.resolve(Accel.KVM, image)
    monkeypatch.setattr(accel, "kvm_usable", lambda img: (True, "boots"))
    assert accel.resolve(Accel.AUTO, image)[0] is Accel.KVM
    assert accel.resolve(Accel.TCG, image)[0] is Accel.TCG


def test_verdict_is_cached(monkeypatch, tmp_path, image, fake_qemu):
    monkeypatch.setenv("RXELAB_CACHE", str(tmp_path / "cache"))
    kvm = tmp_path / "kvm"
    kvm.write_text("")
    monkeypatch.setattr(accel, "KVM_DEVICE", kvm)
    fake_qemu("boots")
    assert accel.kvm_usable(image) == (True, "the guest kernel boots under KVM")
    fake_qemu("refuses")  # a second call must not probe again
    assert accel.kvm_usable(image) == (True, "the guest kernel boots under KVM (cached)")
    image.kernel.write_bytes(b"another kernel")  # a new guest kernel is probed anew
    assert accel.kvm_usable(image)[0] is False


def test_no_kvm_device_means_tcg_without_probing(monkeypatch, tmp_path, image):
    monkeypatch.setattr(accel, "KVM_DEVICE", tmp_path / "absent")
    assert accel.kvm_usable(image) == (False, f"{tmp_path / 'absent'} does not exist")


def test_cpu_model_follows_the_accelerator():
    assert accel.cpu_args(Accel.KVM) == ["-accel", "kvm", "-cpu", "host"]
    tcg = accel.cpu_args(Accel.TCG)
    assert tcg[1] == "tcg,thread=multi" and tcg[3].startswith("qemu64,")
