"""The edges of owned_paths a second reading of issue 56 found: a link another user owns on
the way to the cache (the cache's path was resolved before the check, so the link was never
looked at, and each use resolved it anew), directories made before their parents were
checked, a group-writable directory whose group is another user's primary group, a sudo
whose SUDO_UID outlived it, and image descriptions that reached qemu's command line as found.
Each failed before its fix."""

from __future__ import annotations

import json
import os
import pwd
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import image_cache, owned_paths
from infra.errors import LabError
from tests.unit.shared_tmp import dir_in_tmp, not_under_sudo  # noqa: F401 (autouse)
from tests.unit.strangers import stranger


@pytest.fixture
def tmp() -> Iterator[Path]:
    with dir_in_tmp("rxelab-edges-") as path:
        yield path


def test_a_link_another_user_owns_on_the_way_to_the_cache_is_refused(tmp, monkeypatch):
    who = stranger()
    shared = tmp / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp: anyone may put a link there
    (tmp / "mine").mkdir()
    link = shared / "theirs"
    link.symlink_to(tmp / "mine")  # leads to a directory of ours, for now
    os.lchown(link, who.pw_uid, who.pw_gid)
    monkeypatch.setenv("RXELAB_CACHE", str(link / "cache"))
    with pytest.raises(LabError, match=re.escape(f"{link} is a symbolic link of uid {who.pw_uid}")):
        owned_paths.cache_subdir("images", make=True)
    assert not (tmp / "mine" / "cache").exists()  # nothing made through it


def test_nothing_is_made_under_a_directory_another_user_can_write(tmp, monkeypatch):
    (tmp / "open").mkdir()
    (tmp / "open").chmod(0o777)
    monkeypatch.setenv("RXELAB_CACHE", str(tmp / "open" / "cache"))
    with pytest.raises(LabError, match=re.escape(f"{tmp / 'open'} can be written by other users")):
        owned_paths.cache_subdir("simulator", make=True)
    assert not (tmp / "open" / "cache").exists()


def test_the_cache_is_returned_resolved_once_checked(tmp, monkeypatch):
    (tmp / "real").mkdir()
    (tmp / "name").symlink_to(tmp / "real")  # our own link: followed, checked, resolved
    monkeypatch.setenv("RXELAB_CACHE", str(tmp / "name"))
    assert owned_paths.cache_subdir("images", make=True) == tmp / "real" / "images"


def test_a_group_writable_directory_is_private_only_if_no_other_user_has_its_group(tmp,
                                                                                  monkeypatch):
    me = pwd.getpwuid(os.geteuid())
    d = tmp / "group-writable"
    d.mkdir()
    os.chown(d, me.pw_uid, me.pw_gid)
    d.chmod(0o775)
    if not owned_paths._private_group(os.stat(d)):
        pytest.skip(f"{me.pw_name}'s primary group is not a private group here")
    owned_paths.check_chain(d)  # the owner's private group: fine
    other = pwd.struct_passwd(("other", "x", me.pw_uid + 4242, me.pw_gid, "", "/", "/bin/sh"))
    everyone = pwd.getpwall()
    monkeypatch.setattr(pwd, "getpwall", lambda: [*everyone, other])
    with pytest.raises(LabError, match=re.escape(f"{d} can be written by other users (mode 0775")):
        owned_paths.check_chain(d)


@pytest.mark.parametrize("login, trusted", [(None, True), ("invoker", True), (0, False)])
def test_under_sudo_the_invokers_directories_are_trusted_only_if_the_login_was_theirs(
        tmp, monkeypatch, login, trusted):
    who = stranger()
    d = tmp / "theirs"
    d.mkdir(mode=0o755)
    os.chown(d, who.pw_uid, who.pw_gid)
    monkeypatch.setenv("SUDO_UID", str(who.pw_uid))
    monkeypatch.setattr(owned_paths, "login_uid",
                        lambda: who.pw_uid if login == "invoker" else login)
    if trusted:
        owned_paths.check_chain(d / "lab")
    else:
        with pytest.raises(LabError, match=re.escape(f"{d} belongs to uid {who.pw_uid}")):
            owned_paths.check_chain(d / "lab")


def test_under_sudo_a_file_the_invoker_owns_is_still_not_run(tmp, monkeypatch):
    who = stranger()
    program = tmp / "program"
    program.write_text("#!/bin/sh\n")
    os.chown(program, who.pw_uid, who.pw_gid)
    monkeypatch.setenv("SUDO_UID", str(who.pw_uid))
    monkeypatch.setattr(owned_paths, "login_uid", lambda: who.pw_uid)
    with pytest.raises(LabError, match=re.escape(f"{program} belongs to uid {who.pw_uid}")):
        owned_paths.check_owned_file(program, "run")


def manifest(tmp: Path, **fields: object) -> Path:
    d = tmp / "images" / "debian-13"
    d.mkdir(parents=True, exist_ok=True)
    (d / "disk.raw").write_bytes(b"disk")
    doc = {"kind": "debian-13", "disk": str(d / "disk.raw"), "disk_format": "raw",
           "kernel": None, "initrd": None, **fields}
    (d / "image.json").write_text(json.dumps(doc))
    return d / "image.json"


@pytest.mark.parametrize("text, said", [
    ("not json", "JSONDecodeError"),
    ("[]", "not a JSON object"),
    ('{"kind": "debian-13"}', "KeyError"),
    ('{"kind": "windows", "disk": "/d", "disk_format": "raw"}', "ValueError"),
])
def test_a_malformed_image_description_is_one_line(tmp, text, said):
    path = manifest(tmp)
    path.write_text(text)
    with pytest.raises(LabError, match=re.escape(said)) as refused:
        image_cache.load_manifest(path)
    assert str(path) in refused.value.message and "\n" not in refused.value.message


@pytest.mark.parametrize("fields, said", [
    ({"disk_format": "raw,file=/etc/shadow"}, "names the disk format 'raw,file=/etc/shadow'"),
    ({"disk": "disk.raw"}, "'disk.raw' is not an absolute path"),
    ({"disk": "/x/disk.raw,file=/etc/shadow"}, "is not an absolute path without commas"),
])
def test_what_reaches_qemus_command_line_is_checked(tmp, fields, said):
    with pytest.raises(LabError, match=re.escape(said)):
        image_cache.load_manifest(manifest(tmp, **fields))


def test_a_well_formed_description_is_taken(tmp):
    image = image_cache.load_manifest(manifest(tmp))
    assert image.disk_format == "raw" and image.disk.name == "disk.raw"
