"""The README is a page a newcomer acts on in five minutes, and the documentation site in docs/
holds the rest (issue 59). Before, the README was 2,000 lines of lab notebook: the first
command of goal 1 came after ~810 lines. Now the README stays short, with three quickstarts of
10-20 lines, and its links lead to files and headings that exist; every page the site's
navigation names exists, and no page is left out of it unnamed; the site builds with
`mkdocs build --strict` (a broken link, anchor or missing page fails it) and loads nothing from
elsewhere."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

from infra.config import REPO

README = REPO / "README.md"
MKDOCS = REPO / "mkdocs.yml"
MOST_LINES = 200
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def sections(text: str) -> dict[str, list[str]]:
    """The page's `## ` sections: their lines, trailing blank lines left out."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if line.startswith("## ") and not fenced:
            current = out.setdefault(line[3:], [])
        elif current is not None:
            current.append(line)
    return {title: "\n".join(lines).rstrip("\n").split("\n") for title, lines in out.items()}


def headings_of(page: Path) -> set[str]:
    """The anchors the site gives a page's headings (its toc's slugs)."""
    fenced, found = False, set()
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            found.add(slugify(m.group(1), "-"))
    return found


def config() -> dict:
    return yaml.safe_load(MKDOCS.read_text())


def nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    raise TypeError(f"a nav entry that is no page: {nav!r}")


def test_the_readme_is_short_enough_to_act_on_in_five_minutes():
    lines = README.read_text().splitlines()
    assert len(lines) <= MOST_LINES, f"README.md has {len(lines)} lines: the rest belongs in docs/"


def test_the_readme_has_three_quickstarts_of_ten_to_twenty_lines():
    quick = {t: lines for t, lines in sections(README.read_text()).items() if t.startswith("Quickstart")}
    assert len(quick) == 3, sorted(quick)
    for title, lines in quick.items():
        assert 10 <= len(lines) <= 20, f"{title!r} takes {len(lines)} lines"


def test_the_section_counter_counts_a_quickstart_s_lines():
    """The counter can fail: a section of 25 lines is 25, trailing blank lines not counted."""
    got = sections("## Quickstart 1: x\n" + "line\n" * 25 + "\n\n## Next\n")
    assert len(got["Quickstart 1: x"]) == 25


def test_every_link_of_the_readme_leads_to_a_file_and_heading_that_exist():
    links = [t for t in LINK.findall(README.read_text()) if not re.match(r"[a-z]+:", t)]
    assert len(links) >= 15, links
    for target in links:
        path, _, anchor = target.partition("#")
        assert (REPO / path).exists(), f"README.md links {target}: no such file"
        if anchor:
            assert anchor in headings_of(REPO / path), f"README.md links {target}: no such heading"


def test_every_page_the_navigation_names_exists():
    pages = nav_pages(config()["nav"])
    assert len(pages) >= 15, pages
    docs = REPO / config()["docs_dir"]
    for page in pages:
        assert (docs / page).is_file(), f"mkdocs.yml's nav names {page}, which is not in docs/"


def test_no_page_is_left_out_of_the_navigation_unnamed():
    """A page is in the nav, or kept out by a pattern of not_in_nav (the dated validation files,
    linked from the results page)."""
    docs = REPO / config()["docs_dir"]
    listed = set(nav_pages(config()["nav"]))
    kept_out = [p.strip().lstrip("/") for p in config().get("not_in_nav", "").splitlines() if p.strip()]
    for page in sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md")):
        assert page in listed or any(fnmatch.fnmatch(page, pat) for pat in kept_out), \
            f"docs/{page} is neither in mkdocs.yml's nav nor in its not_in_nav"


@pytest.mark.slow
def test_the_site_builds_strictly_and_loads_nothing_from_elsewhere(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about MkDocs 2
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                        str(MKDOCS), "--site-dir", str(site)],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    warnings = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("WARNING")]
    assert r.returncode == 0 and not warnings, "\n".join(warnings) or r.stderr[-3000:]
    api = (site / "api" / "index.html").read_text()
    assert 'id="rxelab.comm.Communicator.alltoall"' in api, "the API page lost the docstrings"
    for page in site.rglob("*.html"):
        fetched = re.findall(r'<(?:link|script)[^>]+(?:href|src)="(https?://[^"]+)"', page.read_text())
        assert not fetched, f"{page.relative_to(site)} loads {fetched}"
