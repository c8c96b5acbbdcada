"""Every relative link of the README, CONTRIBUTING and the pages under docs/ (reports included)
resolves: to a file or folder of the repository, and for ``page.md#anchor`` to a heading of that
page (GitHub's anchor of it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)|(?:src|href)=\"([^\"]+)\"")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def pages(root: Path = ROOT):
    return [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").rglob("*.md"))]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped but '-' and '_', spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path):
    text = CODE.sub("", page.read_text(encoding="utf-8"))
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def broken_links(root: Path = ROOT):
    bad = []
    for page in pages(root):
        text = CODE.sub("", page.read_text(encoding="utf-8"))
        for m in LINK.finditer(text):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
                continue   # a URL
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: {target}"
            if not dest.exists():
                bad.append(where)
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                bad.append(f"{where} (no such heading)")
    return bad


def test_every_relative_link_resolves():
    assert broken_links() == []


def test_the_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "CONTRIBUTING.md").write_text("# Set-up, then tests\n")
    (tmp_path / "docs" / "a.png").write_bytes(b"")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.png) [gone](docs/b.png) [web](https://x.org/y) `[code](nowhere.md)`\n"
        "[head](CONTRIBUTING.md#set-up-then-tests) [no head](CONTRIBUTING.md#setup) <img src=\"docs/c.png\">\n")
    assert broken_links(tmp_path) == ["README.md: docs/b.png", "README.md: CONTRIBUTING.md#setup (no such heading)",
                                      "README.md: docs/c.png"]
