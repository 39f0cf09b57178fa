"""The Debian mirror that builds the lab's image, taken from the host's own apt sources, so no
mirror's name is written anywhere of ours and a host behind a mirror of its own keeps using it.

Hosts come set up in both of apt's formats: Debian 12's installer writes the one-line
`/etc/apt/sources.list`, newer systems deb822 `*.sources` files, and a hand-kept host may have
both. apt reads sources.list first, then sources.list.d/ in name order; so do we, and the first
`deb` entry for a Debian suite names the mirror. The image's suite may differ from the host's
(a Debian 12 host builds a Debian 13 image): every Debian entry of the host (the release, its
-updates, its -security) is written again for the image's suite, with its URIs and keyring.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from infra.errors import LabError

APT_DIR = Path("/etc/apt")
# Debian's release names and aliases; an entry whose suite is none of these (Ubuntu's noble,
# a third party's repository) names no Debian mirror.
DEBIAN_SUITES = frozenset({
    "buster", "bullseye", "bookworm", "trixie", "forky", "duke", "sid",
    "oldoldstable", "oldstable", "stable", "testing", "unstable",
})
SUFFIX = re.compile(r"^(?P<release>[a-z]+)(?P<pocket>-updates|-security|-backports|/updates)?$")
NO_MIRROR_HINT = ("give a Debian mirror's sources file (RXELAB_APT_SOURCES=/path/to/debian.sources, "
                  "deb822 or one-line), or use IMAGE=ubuntu-24.04")


@dataclass(frozen=True)
class AptEntry:
    """One `deb` source: a URI, the suites served from it, their components and keyring."""

    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str = ""  # a keyring path, or an inline key (deb822 only); "" when not given

    def debian_suites(self) -> tuple[str, ...]:
        return tuple(s for s in self.suites if (m := SUFFIX.match(s)) and m["release"] in DEBIAN_SUITES)


def parse_one_line(text: str) -> list[AptEntry]:
    """`deb [opt=value ...] URI SUITE [COMPONENT ...]` lines; deb-src and comments skipped."""
    entries = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        rest = line[4:].strip()
        options: dict[str, str] = {}
        if rest.startswith("["):
            inside, _, rest = rest[1:].partition("]")
            for option in inside.split():
                key, _, value = option.partition("=")
                options[key.strip().lower()] = value.strip()
        fields = rest.split()
        if len(fields) < 2:
            continue
        entries.append(AptEntry(fields[0], (fields[1],), tuple(fields[2:]), options.get("signed-by", "")))
    return entries


def _deb822_paragraphs(text: str) -> list[dict[str, str]]:
    paragraphs: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                paragraphs.append(current)
            current, key = {}, ""
        elif line[0] in " \t" and key:  # a continuation line (an inline key's body)
            body = line.strip()
            current[key] += "\n" + ("" if body == "." else body)
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            current[key] = value.strip()
    if current:
        paragraphs.append(current)
    return paragraphs


def parse_deb822(text: str) -> list[AptEntry]:
    """deb822 paragraphs (Types/URIs/Suites/Components/Signed-By), one entry per URI; a
    paragraph with `Enabled: no` is skipped, as apt skips it."""
    entries = []
    for p in _deb822_paragraphs(text):
        if "deb" not in p.get("types", "").split() or p.get("enabled", "yes").lower() == "no":
            continue
        suites = tuple(p.get("suites", "").split())
        for uri in p.get("uris", "").split():
            entries.append(AptEntry(uri, suites, tuple(p.get("components", "").split()),
                                    p.get("signed-by", "")))
    return entries


def parse(path: Path) -> list[AptEntry]:
    """A sources file of either format, told apart by its content (a file given by the user
    may be named anything)."""
    text = path.read_text(errors="replace")
    deb822 = any(re.match(r"(?i)^(types|uris|suites)\s*:", ln) for ln in text.splitlines())
    return parse_deb822(text) if deb822 else parse_one_line(text)


def host_files(apt_dir: Path = APT_DIR) -> list[Path]:
    """The host's sources files in the order apt reads them."""
    files = [apt_dir / "sources.list"]
    parts = apt_dir / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    return [f for f in files if f.is_file()]


def debian_entries(files: list[Path]) -> list[AptEntry]:
    """Every Debian entry of these files, in apt's order, the mirror's first; or a LabError
    that says where it looked and what to do."""
    found: list[AptEntry] = []
    for f in files:
        try:
            entries = parse(f)
        except OSError as err:
            raise LabError(f"cannot read the apt sources file {f}: {err.strerror}",
                           hint=NO_MIRROR_HINT) from None
        found += [e for e in entries if e.debian_suites()]
    if not found:
        where = ", ".join(str(f) for f in files) or "no apt sources file"
        raise LabError(f"no Debian mirror in the host's apt sources ({where})", hint=NO_MIRROR_HINT)
    return found


def for_suite(entries: list[AptEntry], suite: str) -> list[AptEntry]:
    """The entries again for another release: bookworm-security becomes <suite>-security."""
    out: list[AptEntry] = []
    for e in entries:
        suites = []
        for s in e.debian_suites():
            m = SUFFIX.match(s)
            assert m is not None
            pocket = "-security" if m["pocket"] == "/updates" else (m["pocket"] or "")
            if pocket == "-backports":
                continue  # not part of a release's image
            suites.append(suite + pocket)
        new = replace(e, suites=tuple(dict.fromkeys(suites)), components=("main",))
        if new.suites and new not in out:
            out.append(new)
    return out


def deb822(entries: list[AptEntry]) -> str:
    """The entries as a deb822 sources file."""
    paragraphs = []
    for e in entries:
        lines = ["Types: deb", f"URIs: {e.uri}", f"Suites: {' '.join(e.suites)}",
                 f"Components: {' '.join(e.components)}"]
        if e.signed_by:
            first, *more = e.signed_by.split("\n")
            lines.append(f"Signed-By: {first}")
            lines += [f" {m}" if m else " ." for m in more]
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs) + "\n"


def image_sources(suite: str, given: Path | None, apt_dir: Path = APT_DIR) -> str:
    """The deb822 sources that build `suite`: from the file the user gave, or from the
    host's apt sources; a LabError before anything is made when neither names a mirror."""
    if given is not None and not given.is_file():
        raise LabError(f"RXELAB_APT_SOURCES={given}: no such file", hint=NO_MIRROR_HINT)
    entries = debian_entries([given] if given is not None else host_files(apt_dir))
    return deb822(for_suite(entries, suite))
