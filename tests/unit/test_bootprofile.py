"""The boot profile's reading of what a real node said (tests/fixtures/boot-profile-node2.txt:
the remote script's output on a lab node under TCG, one-process cloud-init stages)."""

from infra import bootprofile
from infra.config import REPO

SAMPLE = (REPO / "tests" / "fixtures" / "boot-profile-node2.txt").read_text()


def test_phases_add_up_to_the_node_s_own_account_of_its_boot():
    p = bootprofile.parse("node2", SAMPLE, seen_ready=54.6)
    assert 2 < p.phases["kernel"] < 10 and 2 < p.phases["initrd"] < 10
    local = p.phases["cloud-init init-local"]
    startup, work = p.phases["  init-local: Python start-up"], p.phases["  init-local: its work"]
    assert 0 < startup < local and 0 < work < local and abs(local - startup - work) < 2
    assert "cloud-init modules-final (same process)" in p.phases, "stages run in one process"
    assert "cloud-init modules-config" not in p.phases
    assert set(p.marks) == {"ssh.service active", "rxe0.service active",
                            "cloud-init finished (boot-finished)"}
    assert p.guest_ready == max(p.marks.values())
    # the kernel, initrd, systemd and the stages come one after the other: their sum is the
    # moment the last stage ended, within the rounding of boot-finished's time stamp
    serial = sum(v for k, v in p.phases.items()
                 if not k.startswith(("  ", "network")) and "same process" not in k)
    assert abs(serial - p.marks["cloud-init finished (boot-finished)"]) < 2.5, (serial, p.marks)


def test_cpu_and_modules_are_read():
    p = bootprofile.parse("node2", SAMPLE)
    assert p.cpu == sorted(p.cpu, reverse=True) and p.cpu[0][0] > 1
    assert any(group.endswith("cloud-init-local.service") for _, group in p.cpu)
    top_seconds, top_module = p.modules[0]
    assert top_module == "init-local/config-users-groups" and 0 < top_seconds < 5
    assert {m for _, m in p.modules} >= {"init-local/config-write-files",
                                         "modules-final/config-final-message"}


def test_module_times_pair_the_latest_boot_s_events():
    lines = [
        "2026-11-24 12:00:00,000 - handlers.py[DEBUG]: start: init-local/config-ssh: running",
        "2026-11-24 12:00:01,500 - handlers.py[DEBUG]: finish: init-local/config-ssh: SUCCESS",
        "2026-11-24 13:00:00,000 - handlers.py[DEBUG]: start: init-local/config-ssh: running",
        "2026-11-24 13:00:00,250 - handlers.py[DEBUG]: finish: init-local/config-ssh: SUCCESS",
        "2026-11-24 13:00:00,300 - handlers.py[DEBUG]: finish: init-local/config-x: no start",
    ]
    assert bootprofile.module_times(lines) == [(0.25, "init-local/config-ssh")]


def test_a_node_that_says_nothing_gives_an_empty_profile_not_a_crash():
    p = bootprofile.parse("n", "== end\n")
    assert p.phases == {} and p.guest_ready is None and p.modules == []


def test_the_table_shows_every_phase_of_every_node_and_the_target():
    import io

    from rich.console import Console

    a = bootprofile.parse("node2", SAMPLE, seen_ready=54.6)
    b = bootprofile.parse("node9", "== end\n")
    out = io.StringIO()
    bootprofile.show([a, b], Console(file=out, width=200))
    text = out.getvalue()
    row = next(x for x in text.splitlines() if "init-local: Python start-up" in x)
    assert f"{a.phases['  init-local: Python start-up']:.1f}" in row and row.rstrip("│ ").endswith("-")
    assert "rxe0.service active, at" in text and "config-users-groups" in text
    assert "slowest node ready 54.6 s after its qemu started (target <= 45 s)" in text


def test_slurms_daemons_are_shown_beside_readiness_not_in_it():
    """Where Slurm's daemons came up and what CPU they took; "ready" stays ssh, the RDMA unit
    and cloud-init (the daemons start after it)."""
    blocks = ("Id=munge.service\nInactiveExitTimestampMonotonic=50000000\n"
              "ActiveEnterTimestampMonotonic=51500000\nCPUUsageNSec=700000000\n\n"
              "Id=slurmd.service\nInactiveExitTimestampMonotonic=52000000\n"
              "ActiveEnterTimestampMonotonic=55250000\nCPUUsageNSec=2300000000\n\n"
              "Id=slurmctld.service\nInactiveExitTimestampMonotonic=0\n"
              "ActiveEnterTimestampMonotonic=0\nCPUUsageNSec=18446744073709551615\n\n")
    plain = bootprofile.parse("node2", SAMPLE)
    text = SAMPLE.replace("== units\n", "== units\n" + blocks, 1)
    p = bootprofile.parse("node2", text)
    assert p.marks["munge.service active"] == 51.5 and p.marks["slurmd.service active"] == 55.25
    assert "slurmctld.service active" not in p.marks, "not on this node: no mark"
    assert p.marks["rxe0.service active"] == plain.marks["rxe0.service active"], \
        "the RDMA unit is still the one found"
    assert p.guest_ready == plain.guest_ready
    assert abs(p.phases["Slurm daemons' CPU since boot (munged, slurmd, slurmctld)"] - 3.0) < 1e-9
    assert "munge.service slurmd.service slurmctld.service" in bootprofile.REMOTE
