"""The documentation holds together: the CLI reference is the command tree's, the README stays a front door, and
every relative link of README.md and docs/*.md leads to a file (and a heading) that exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from harness.cli.reference import render_reference

from .kit.budget import FORBIDDEN

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 220

# [text](target) and ![alt](target); the target ends at the first space (a title may follow) or ')'.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())  # a link inside a code block is text, not a link
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, mailto:, ...


def _slugs(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as '-', and a
    repeated heading numbered (-1, -2, ...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_cli_reference_is_the_command_tree() -> None:
    committed = (ROOT / "docs" / "cli.md").read_text()
    assert render_reference() == committed, (
        "docs/cli.md differs from the command tree (harness/cli/reference.py renders it): run `make docs` "
        "and commit docs/cli.md")


def test_cli_reference_loads_no_heavy_library() -> None:
    # It loads every command's module as running that command would, and nothing a read command must not import.
    code = ("import sys\nfrom harness.cli.reference import render_reference\nrender_reference()\n"
            f"print(sorted(m for m in {list(FORBIDDEN)!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail into a page of docs/ "
        "and link it from the README's map of the docs")
    text = "\n".join(lines)
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):  # the two commands that do all the set-up
        assert f"make {target}" in text, f"README.md does not give `make {target}`"
        assert re.search(rf"^{target}:", makefile, re.M), f"the Makefile has no {target} target"
    linked = {t.split("#")[0] for t in _links(README) if t.startswith("docs/") and t.split("#")[0].endswith(".md")}
    assert linked, "README.md links no page of docs/"
    for page in sorted(linked):
        assert (ROOT / page).is_file(), f"README.md links {page}, which does not exist"
    unlinked = sorted(p.name for p in DOCS if f"docs/{p.name}" not in linked)
    assert not unlinked, f"pages of docs/ missing from the README's map: {unlinked}"


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in [README, *DOCS]:
        for target in _links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where} names no file")
            elif anchor and dest.suffix == ".md" and anchor not in _slugs(dest):
                broken.append(f"{where} names no heading of {dest.relative_to(ROOT)}")
    assert not broken, "broken links:\n" + "\n".join(broken)
