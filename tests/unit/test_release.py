"""What a release is made of, kept in step without building anything (issue 59): the version
lives in one place, rxelab.__version__, which both pyprojects read (as setuptools resolves
them) and CHANGELOG.md's newest entry names; a tag v<version> agrees with both; lib/LICENSE is
the repository's LICENSE (license-files may not reach outside lib/); and fab deploy, which
builds the wheel with the venv's own setuptools, says in one line when they are too old for
the PEP 639 licence. The wheel itself is checked in test_wheel.py (slow)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import rxelab
from packaging.version import Version
from setuptools.config.pyprojecttoml import read_configuration  # type: ignore[import-untyped]  # no py.typed

from experiments.running import deploy
from experiments.running.fleet import FleetError
from infra.config import REPO

CHANGELOG = REPO / "CHANGELOG.md"
HEADING = re.compile(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", re.M)


def changelog_versions(text: str) -> list[str]:
    """The released versions' headings, newest first ([Unreleased] left out)."""
    return [v for v, _ in HEADING.findall(text) if v != "Unreleased"]


def tag_problems(tags_at_head: list[str], tags: list[str], version: str,
                 logged: list[str]) -> list[str]:
    """What is wrong between the repository's v* tags, the package's version and the changelog."""
    problems = [f"HEAD is tagged {t}, the package says {version}"
                for t in tags_at_head if t != f"v{version}"]
    problems += [f"{t} has no entry in CHANGELOG.md" for t in tags if t.removeprefix("v") not in logged]
    return problems


def git_tags(*args: str) -> list[str]:
    r = subprocess.run(["git", "-C", str(REPO), "tag", "--list", "v*", *args], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_the_version_is_read_from_one_place_by_both_projects():
    assert Version(rxelab.__version__) >= Version("0.3.0")
    for project in (REPO / "lib" / "pyproject.toml", REPO / "pyproject.toml"):
        config = read_configuration(project, expand=True)
        assert config["project"]["version"] == rxelab.__version__, project
        assert "version" in config["project"]["dynamic"], f"{project} writes a version of its own"


def test_the_changelogs_newest_entry_is_the_packages_version():
    text = CHANGELOG.read_text()
    versions = changelog_versions(text)
    assert versions and versions[0] == rxelab.__version__, \
        f"CHANGELOG.md's newest entry is {versions[:1]}, rxelab.__version__ is {rxelab.__version__}"
    assert [Version(v) for v in versions] == sorted((Version(v) for v in versions), reverse=True)
    assert "0.2.0" in versions and "0.1.0" in versions
    assert all(date for v, date in HEADING.findall(text) if v != "Unreleased"), "a release without a date"


def test_the_changelog_reader_skips_unreleased_and_reads_the_newest_first():
    text = "# Changelog\n\n## [Unreleased]\n\n## [1.2.0] - 2027-01-01\n- x\n\n## [1.1.0] - 2026-12-01\n"
    assert changelog_versions(text) == ["1.2.0", "1.1.0"]


def test_the_tags_agree_with_the_version_and_the_changelog():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout (a source tarball): no tags to hold")
    logged = changelog_versions(CHANGELOG.read_text())
    assert tag_problems(git_tags("--points-at", "HEAD"), git_tags(), rxelab.__version__, logged) == []


def test_a_tag_the_version_or_the_changelog_does_not_know_is_named():
    assert tag_problems(["v0.3.0"], ["v0.2.0", "v0.3.0"], "0.3.0", ["0.3.0", "0.2.0"]) == []
    assert tag_problems(["v0.3.1"], ["v0.3.1"], "0.3.0", ["0.3.0"]) == [
        "HEAD is tagged v0.3.1, the package says 0.3.0", "v0.3.1 has no entry in CHANGELOG.md"]


def test_the_library_carries_the_repositorys_licence():
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) 2026 the rxelab authors" in text
    assert (REPO / "lib" / "LICENSE").read_text() == text, "lib/LICENSE is not a copy of LICENSE"
    assert (REPO / "lib" / "rxelab" / "py.typed").is_file()


def test_build_tools_too_old_for_the_wheel_are_named_with_what_was_found(tmp_path):
    assert deploy.unmet_build_requirements() == [], "this venv cannot build the wheel"
    project = tmp_path / "pyproject.toml"
    project.write_text('[build-system]\nrequires = ["setuptools>=999", "no-such-build-tool>=1"]\n')
    found = deploy.unmet_build_requirements(project)
    assert len(found) == 2
    assert re.fullmatch(r"setuptools>=999 \(found [0-9.]+\)", found[0]), found
    assert found[1] == "no-such-build-tool>=1 (not installed)"


def test_a_deploy_with_old_build_tools_stops_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(deploy, "unmet_build_requirements", lambda: ["setuptools>=77.0.3 (found 70.1.0)"])
    with pytest.raises(FleetError) as e:
        deploy.build_wheel(tmp_path)
    said = str(e.value)
    assert "\n" not in said and "setuptools>=77.0.3 (found 70.1.0)" in said and "make deps" in said
    assert not list(tmp_path.iterdir()), "a build was started"
