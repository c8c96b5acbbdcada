"""The commands the documentation shows: every shell command of a fenced ```bash block of the pages
below, and every ```python block of the pages whose snippets are meant to run, with the doc's own
markers for the ones no CPU test can run.

A marker is an HTML comment (it renders as nothing) right before a block, one line per command
prefix::

    <!-- doc-test: not run by tests/docs, and why
    hf download => needs the network (the Hugging Face Hub)
    mopd retriever assemble => needs Search-R1's wiki-18 download (about 80 GB)
    -->

A command of that block whose text starts with a prefix (whole words; ``PREFIX$``: the whole
command) is not run, for that reason; a prefix that matches no command of its block is an error (a
marker cannot outlive its command)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# the pages whose commands are tests; python snippets only where the page shows code meant to run
PAGES = ("README.md", "docs/gpu_training.md", "docs/demo.md", "docs/viewer.md", "docs/method.md",
         "docs/architecture.md", "docs/run_directories.md", "docs/performance.md", "kernels/README.md",
         "mopd/retriever/README.md", "mopd/eval/README.md")
PYTHON_PAGES = ("README.md", "kernels/README.md", "mopd/retriever/README.md")

FENCE = re.compile(r"^```(\S*)\s*$")
MARKER_OPEN = "<!-- doc-test:"


@dataclass(frozen=True)
class DocCommand:
    page: str          # path relative to the repository root
    section: str       # the heading the command sits under
    line: int          # 1-based line of its first line in the page
    lang: str          # "bash" or "python"
    text: str          # one command (continuations joined, comment lines dropped), or a whole snippet
    skip: str | None   # the doc's reason for not running it, or None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


class MarkerError(ValueError):
    """A doc-test marker that is malformed or names no command of its block."""


def parse_marker(lines: list[str], where: str) -> dict[str, str]:
    """``prefix => reason`` lines of one marker comment."""
    rules = {}
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        prefix, sep, reason = line.partition("=>")
        if not sep or not prefix.strip() or not reason.strip():
            raise MarkerError(f"{where}: a doc-test marker line is 'COMMAND PREFIX => REASON', not {line!r}")
        rules[prefix.strip()] = reason.strip()
    return rules


def starts_with(text: str, prefix: str) -> bool:
    """``text`` starts with ``prefix`` as whole words (``make test`` is not ``make test-slow``); a
    prefix ending in ``$`` is the whole command, its trailing comment left out."""
    if prefix.endswith("$"):
        return re.match(re.escape(prefix[:-1]) + r"\s*(#.*)?$", text) is not None
    return re.match(re.escape(prefix) + r"(?![\w-])", text) is not None


def shell_commands(block: list[str], first_line: int) -> list[tuple[int, str]]:
    """(line, command) of a bash block: backslash continuations joined; comment-only lines dropped
    (the trailing comment of a line stays: the shell drops it when it runs)."""
    out, current, start = [], "", 0
    for i, line in enumerate(block):
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if not current:
            start = first_line + i
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1].rstrip() + " "
            continue
        current += stripped
        out.append((start, current.strip()))
        current = ""
    if current:
        out.append((start, current.strip()))
    return out


def page_commands(page: str, root: Path = ROOT) -> list[DocCommand]:
    """Every command of one page, in order, with its marker's reason where it has one."""
    lines = (root / page).read_text(encoding="utf-8").splitlines()
    commands: list[DocCommand] = []
    section, marker, marker_line, i = "", None, 0, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(MARKER_OPEN):
            body, j = [line[len(MARKER_OPEN):]], i
            while "-->" not in lines[j]:
                j += 1
                body.append(lines[j])
            body[-1] = body[-1].split("-->", 1)[0]
            # the first line may be a title (free text, no "=>"); rules follow
            rules = body if "=>" in body[0] else body[1:]
            marker, marker_line, i = parse_marker(rules, f"{page}:{i + 1}"), i + 1, j + 1
            continue
        heading = re.match(r"^#{1,6}\s+(.+?)\s*$", line)
        if heading:
            section = heading.group(1)
        fence = FENCE.match(line)
        if not fence:
            if line.strip() and marker is not None:
                raise MarkerError(f"{page}:{marker_line}: a doc-test marker must come right before a fenced block")
            i += 1
            continue
        lang, j = fence.group(1), i + 1
        while not lines[j].startswith("```"):
            j += 1
        block = lines[i + 1:j]
        rules, marker = marker or {}, None
        found: list[tuple[int, str]] = []
        if lang == "bash":
            found = shell_commands(block, i + 2)
        elif lang == "python" and page in PYTHON_PAGES:
            found = [(i + 2, "\n".join(block) + "\n")]
        used = set()
        for at, text in found:
            reason = next((r for p, r in rules.items() if starts_with(text, p) and not used.add(p)), None)
            commands.append(DocCommand(page, section, at, "python" if lang == "python" else "bash", text, reason))
        stale = sorted(set(rules) - used)
        if stale:
            raise MarkerError(f"{page}:{marker_line}: doc-test marker names no command of its block: {stale}")
        i = j + 1
    return commands


def all_commands(root: Path = ROOT) -> list[DocCommand]:
    return [c for page in PAGES for c in page_commands(page, root)]
