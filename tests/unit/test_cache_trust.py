"""The cache is trusted only if it is the caller's own (issue 56, item 2): `fab simulate` ran
`simulator/replay-<digest>` (and SMPI's `mpi_bench-<digest>`) from it whoever put it there,
the digest being of public inputs, and provision took `images/*/image.json` as found, with
paths anywhere (`/etc/shadow` as a disk). Here another user (`nobody`, a process of its own)
plants a program in a cache it can write: it is refused and not run (the program would leave
a marker). Each failed before: the planted program ran as root, the manifest was taken."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from rxelab import trace

from experiments.simulation import platforms, replayer, smpi
from experiments.simulation.costs import Costs, Segment
from infra import image_cache, images
from infra.config import Extras, Image
from infra.errors import LabError
from tests.unit.shared_tmp import dir_in_tmp, not_under_sudo  # noqa: F401 (autouse)
from tests.unit.strangers import run_as_stranger, stranger

FREE = Costs(send=(Segment(1 << 62, 0.0, 0.0),), recv=(Segment(1 << 62, 0.0, 0.0),))
PLANT = """
import os, sys
program, marker = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(program), exist_ok=True)
with open(program, "w") as f:
    f.write(f"#!/bin/sh\\ntouch '{marker}'\\necho time 1.0\\necho rank 0 1.0 0\\n")
os.chmod(program, 0o755)
print("planted")
"""



@pytest.fixture
def cache(monkeypatch) -> Iterator[Path]:
    """RXELAB_CACHE in /tmp, where another user can reach it; removed at the end."""
    with dir_in_tmp("rxelab-cache-") as path:
        monkeypatch.setenv("RXELAB_CACHE", str(path / "cache"))
        yield path / "cache"


def opened(cache: Path, how: str) -> str:
    """The cache made writable by another user (as `how` says); what its refusal names."""
    cache.mkdir(exist_ok=True)
    cache.parent.chmod(0o755)
    if how == "mode 0777":
        cache.chmod(0o777)
        return f"{cache} can be written by other users (mode 0777, not sticky)"
    who = stranger()
    os.chown(cache, who.pw_uid, who.pw_gid)
    return f"{cache} belongs to uid {who.pw_uid}, neither you"


def replayer_path() -> Path:
    return replayer.cached_program(replayer.SOURCE, replayer.recipe()[0], replayer.INCLUDES)


@pytest.mark.parametrize("how", ["mode 0777", "nobody's own"])
def test_a_replayer_another_user_planted_in_the_cache_is_refused_and_not_run(cache, how):
    said = opened(cache, how)
    marker = cache.parent / "planted-program-ran"
    planted = run_as_stranger(PLANT, str(replayer_path()), str(marker))
    assert planted.stdout.strip() == "planted", planted.stderr
    t = trace.record("alltoall", "pairwise", 2, 1 << 17)
    with pytest.raises(replayer.SimulationError, match=re.escape(said)) as refused:
        replayer.replay(t, platforms.Platform("cluster", 2, 1e9, 5e-6), FREE)
    assert "refusing to act in" in str(refused.value)
    assert not marker.exists(), "root ran the program another user planted"


PLANT_LIBRARY = """
import os, subprocess, sys
program, marker = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(program), exist_ok=True)
source = program + ".c"
with open(source, "w") as f:
    f.write('#include <stdio.h>\\n__attribute__((constructor)) static void ran(void) '
            '{ fclose(fopen("%s", "w")); }\\nint main(void) { return 0; }\\n' % marker)
subprocess.run(["gcc", "-shared", "-fPIC", "-o", program, source], check=True)
print("planted")
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc makes the planted program")
def test_smpis_program_planted_by_another_user_is_refused_and_not_run(cache):
    """smpirun loads the program (dlopen): a constructor of the planted one would run."""
    said = opened(cache, "mode 0777")
    marker = cache.parent / "planted-program-ran"
    where = replayer.cached_program(smpi.SOURCE, smpi.compile_argv)
    planted = run_as_stranger(PLANT_LIBRARY, str(where), str(marker))
    assert planted.stdout.strip() == "planted", planted.stderr
    with pytest.raises(replayer.SimulationError, match=re.escape(said)):
        smpi.run("alltoall", "mpi-default", platforms.Platform("cluster", 2, 1e9, 5e-6), FREE, 1024)
    assert not marker.exists(), "root ran the program another user planted"


@pytest.mark.parametrize("change", ["nobody's file", "mode 0777", "a link"])
def test_a_program_in_the_cache_is_run_only_if_it_is_ones_own(cache, change):
    """The cache's directories are fine; the program itself is not (its owner changed, or
    writable by others, or a link to elsewhere)."""
    marker = cache.parent / "ran"
    program = replayer_path()
    program.parent.mkdir(parents=True)
    real = cache.parent / "elsewhere" if change == "a link" else program
    real.write_text(f"#!/bin/sh\ntouch '{marker}'\n")
    real.chmod(0o777 if change == "mode 0777" else 0o755)
    if change == "a link":
        program.symlink_to(real)
        said = f"{program} is a symbolic link: refusing to run it"
    elif change == "mode 0777":
        said = f"{program} can be written by other users (mode 0777): refusing to run it"
    else:
        who = stranger()
        os.chown(program, who.pw_uid, who.pw_gid)
        said = f"{program} belongs to uid {who.pw_uid}, neither you"
    with pytest.raises(replayer.SimulationError, match=re.escape(said)):
        replayer.binary()
    assert not marker.exists()


def debian_manifest(cache: Path, **paths: str) -> Path:
    """A cached Debian 13 image whose image.json names `paths` (disk, kernel, initrd)."""
    d = cache / "images" / images.debian_image_name(Extras.NONE, Image.DEBIAN13)
    d.mkdir(parents=True)
    for name in ("disk.raw", "vmlinuz", "initrd.img"):
        (d / name).write_bytes(b"part of the image")
    named = {"disk": str(d / "disk.raw"), "kernel": str(d / "vmlinuz"),
             "initrd": str(d / "initrd.img"), **paths}
    (d / "image.json").write_text(image_cache.BaseImage(
        Image.DEBIAN13, Path(named["disk"]), "raw", Path(named["kernel"]),
        Path(named["initrd"])).to_json())
    return d


@pytest.mark.parametrize("field, path", [("disk", "/etc/shadow"),
                                         ("kernel", "{d}/../other/vmlinuz"),
                                         ("initrd", "{d}/link")])
def test_a_manifest_naming_a_path_outside_its_image_directory_is_refused(cache, field, path):
    d = cache / "images" / images.debian_image_name(Extras.NONE, Image.DEBIAN13)
    named = path.format(d=d)
    debian_manifest(cache, **{field: named})
    (d / "link").symlink_to("/etc/passwd")  # inside by name, outside once resolved
    with pytest.raises(LabError, match=re.escape(f"names {named}, not a file in its image directory {d}")):
        images.ensure(Image.DEBIAN13)


def test_a_manifest_another_user_planted_is_refused(cache):
    said = opened(cache, "mode 0777")
    d = cache / "images" / "ubuntu-24.04-0123456789abcdef"
    code = """
import os, sys
d = sys.argv[1]
os.makedirs(d)
open(os.path.join(d, "disk.img"), "w").write("their disk")
open(os.path.join(d, "image.json"), "w").write(
    '{"kind": "ubuntu-24.04", "disk": "%s/disk.img", "disk_format": "qcow2"}' % d)
print("planted")
"""
    planted = run_as_stranger(code, str(d))
    assert planted.stdout.strip() == "planted", planted.stderr
    with pytest.raises(LabError, match=re.escape(said)):
        images.resolve(Image.AUTO)


def test_an_image_file_of_another_user_is_refused(cache):
    d = debian_manifest(cache)
    who = stranger()
    os.chown(d / "vmlinuz", who.pw_uid, who.pw_gid)
    with pytest.raises(LabError, match=re.escape(f"{d / 'vmlinuz'} belongs to uid {who.pw_uid}")):
        images.cached_debian(Extras.NONE, Image.DEBIAN13)


def test_ones_own_cache_and_image_are_taken(cache):
    d = debian_manifest(cache)
    found = images.ensure(Image.DEBIAN13)
    assert found.disk == d / "disk.raw" and found.kernel == d / "vmlinuz"
