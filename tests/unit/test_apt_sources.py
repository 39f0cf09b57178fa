"""The Debian mirror, taken from hosts as people have them: deb822, one-line, both, neither."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import apt_sources
from infra.errors import LabError

MIRROR = "http://mirror.invalid/debian"
SECURITY = "http://mirror.invalid/debian-security"
KEY = "/usr/share/keyrings/debian-archive-keyring.gpg"

DEB822 = f"""Types: deb
# a comment inside a paragraph
URIs: {MIRROR}
Suites: bookworm bookworm-updates
Components: main
Signed-By: {KEY}

Types: deb
URIs: {SECURITY}
Suites: bookworm-security
Components: main
Signed-By: {KEY}
"""
ONE_LINE = f"""# written by Debian's installer
deb [arch=amd64 signed-by={KEY}] {MIRROR} bookworm main non-free-firmware
deb-src {MIRROR} bookworm main
deb {SECURITY} bookworm-security main  # security
deb {MIRROR} bookworm-updates main
"""
UBUNTU = """Types: deb
URIs: http://archive.invalid/ubuntu/
Suites: noble noble-updates noble-backports
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg
"""


def apt_dir(tmp_path: Path, sources_list: str | None = None, **parts: str) -> Path:
    root = tmp_path / "apt"
    (root / "sources.list.d").mkdir(parents=True)
    if sources_list is not None:
        (root / "sources.list").write_text(sources_list)
    for name, text in parts.items():
        (root / "sources.list.d" / name.replace("_", ".")).write_text(text)
    return root


def paragraphs(text: str) -> list[dict[str, str]]:
    return apt_sources._deb822_paragraphs(text)


def test_a_deb822_host_gives_its_mirror_for_the_image_s_suite(tmp_path):
    text = apt_sources.image_sources("trixie", None, apt_dir(tmp_path, debian_sources=DEB822))
    got = paragraphs(text)
    assert [(p["uris"], p["suites"]) for p in got] == [
        (MIRROR, "trixie trixie-updates"), (SECURITY, "trixie-security")]
    assert all(p["signed-by"] == KEY and p["components"] == "main" for p in got)


def test_a_one_line_host_gives_the_same(tmp_path):
    text = apt_sources.image_sources("bookworm", None, apt_dir(tmp_path, ONE_LINE))
    got = [(p["uris"], p["suites"], p.get("signed-by", "")) for p in paragraphs(text)]
    assert got == [(MIRROR, "bookworm", KEY), (SECURITY, "bookworm-security", ""),
                   (MIRROR, "bookworm-updates", "")], "deb-src and comments skipped"


def test_with_both_formats_the_first_entry_in_apt_s_order_names_the_mirror(tmp_path):
    other = DEB822.replace(MIRROR, "http://other.invalid/debian")
    text = apt_sources.image_sources("bookworm", None,
                                     apt_dir(tmp_path, ONE_LINE, debian_sources=other))
    assert paragraphs(text)[0]["uris"] == MIRROR, "sources.list is read before sources.list.d/"


def test_neither_file_or_only_ubuntu_fails_with_what_to_do(tmp_path):
    for root in (apt_dir(tmp_path / "none"), apt_dir(tmp_path / "ubuntu", ubuntu_sources=UBUNTU)):
        with pytest.raises(LabError) as e:
            apt_sources.image_sources("bookworm", None, root)
        assert "no Debian mirror in the host's apt sources" in e.value.message
        assert "RXELAB_APT_SOURCES=" in (e.value.hint or "") and "IMAGE=ubuntu-24.04" in (e.value.hint or "")
    with pytest.raises(LabError, match="ubuntu.sources"):
        apt_sources.image_sources("bookworm", None, apt_dir(tmp_path / "u2", ubuntu_sources=UBUNTU))


def test_a_given_file_overrides_the_host_s_and_is_read_by_its_content(tmp_path):
    given = tmp_path / "my-mirror.txt"  # any name: the format is told by what is inside
    given.write_text(DEB822.replace(MIRROR, "http://given.invalid/debian"))
    text = apt_sources.image_sources("trixie", given, apt_dir(tmp_path, ONE_LINE))
    assert paragraphs(text)[0]["uris"] == "http://given.invalid/debian"
    with pytest.raises(LabError, match="RXELAB_APT_SOURCES=.*no such file"):
        apt_sources.image_sources("trixie", tmp_path / "missing.sources", apt_dir(tmp_path / "x"))


def test_disabled_paragraphs_backports_and_other_archives_are_left_out(tmp_path):
    text = f"""Types: deb
URIs: http://third-party.invalid/repo
Suites: stable-thing
Components: main

Types: deb
URIs: http://disabled.invalid/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb deb-src
URIs: {MIRROR}
Suites: bookworm-backports bookworm
Components: main contrib
"""
    got = paragraphs(apt_sources.image_sources("trixie", None, apt_dir(tmp_path, debian_sources=text)))
    assert [(p["uris"], p["suites"], p["components"]) for p in got] == [(MIRROR, "trixie", "main")]


def test_an_inline_key_is_carried_over_whole(tmp_path):
    inline = ("Types: deb\nURIs: " + MIRROR + "\nSuites: bookworm\nComponents: main\n"
              "Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mQINBGPL\n"
              " -----END PGP PUBLIC KEY BLOCK-----\n")
    out = apt_sources.image_sources("trixie", None, apt_dir(tmp_path, debian_sources=inline))
    assert " -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mQINBGPL\n" in out, out
    (p,) = paragraphs(out)
    assert p["signed-by"].split("\n")[1:] == ["-----BEGIN PGP PUBLIC KEY BLOCK-----", "", "mQINBGPL",
                                               "-----END PGP PUBLIC KEY BLOCK-----"]
