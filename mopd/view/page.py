"""The viewer's page: one self-contained HTML file (CSS, JavaScript and data inlined; no network).

The style and the script are this package's ``assets/viewer.css`` and ``assets/viewer.js``, plain
files read at write time; no build step, no library.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

from mopd.core.atomic import atomic_write_text
from mopd.view.inline_json import no_surrogates
from mopd.view.page_data import PageData

ASSETS = Path(__file__).with_name("assets")

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'">
<link rel="icon" href="data:,">
<title>{title}</title>
<style>{css}</style></head>
<body>
<header><h1 dir="auto">{title}</h1><span class="sources">{sources}</span></header>
<div id="filters">
 <label>dataset <select id="f-dataset"><option value="">all</option></select></label>
 <label>outcome <select id="f-solved"><option value="">any</option><option value="solved">solved</option>
  <option value="unsolved">not solved</option></select></label>
 <label>role <select id="f-role"><option value="">any</option></select></label>
 <label><input type="checkbox" id="f-invalid"> invalid actions</label>
 <label><input type="checkbox" id="f-nosearch"> no search</label>
 <label>search <input type="search" id="f-text" placeholder="question, gold or final answer"></label>
 <label>sort <select id="f-sort"><option value="file">file order</option>
  <option value="diff">largest difference first</option></select></label>
 <label>colour tokens by <select id="f-signal"><option value="">nothing</option></select></label>
 <span class="legend">green: positive advantage · red: negative, or an unlikely token (log-prob);
  hover a token for its value</span>
</div>
<main>
 <div id="listpane"><div class="pager"><button id="prev">&larr;</button><button id="next">&rarr;</button>
  <span id="count"></span></div>
  <table id="list"><thead><tr id="list-head"><th>dataset</th><th>question</th><th>gold</th></tr></thead>
  <tbody id="list-body"></tbody></table></div>
 <div id="detail"><div class="meta">Open a question on the left.</div></div>
</main>
<footer>{note}</footer>
<script type="application/json" id="mopd-data">{data}</script>
<script>{js}</script>
</body></html>
"""


NOTE_ROOM = 2048
"""Bytes kept free for the footer's note (its numbers are known only once the data is built)."""


def size_note(data: PageData) -> str:
    """What the page holds and what it left out to stay within --max-mb (shown in its footer)."""
    n = len(data.workflows)
    mib = data.tree_bytes / 2 ** 20
    bound = f"{data.max_bytes / 2 ** 20:.2f} MiB of data (--max-mb less the page's script and style)"
    if data.past_bound:
        kept = (f"token texts and values kept for {data.with_tokens} of {n} workflows (the page holds at most "
                f"{bound}; the {data.past_bound} after show their text")
        kept += (f", and the last {data.without_tree} of them only their list entry, without a tree)"
                 if data.without_tree else ")")
    elif data.with_tokens < n:
        kept = (f"token texts and values for the {data.with_tokens} of {n} workflows whose records hold token ids "
                "(mopd eval run --keep-token-ids, a run's traces, or --teacher give them)")
    else:
        kept = f"token texts and values kept for all {n} workflows"
    left_out = (f" The last {data.dropped} workflows of the sources are left out of this page: the page holds at most "
                f"{bound}, and not even their list entries fitted (a larger --max-mb shows them)." if data.dropped
                else "")
    shared = sum(q[4] for q in data.questions)
    shared_note = (f" {shared} questions share an id with another question of different text (marked ⚠; shown "
                   "apart, never scored as one another)." if shared else "")
    return (f"{n} workflows of {len(data.questions)} questions. Each workflow's tree is zlib-compressed JSON "
            f"({mib:.1f} MiB in all), inflated when it is opened; the list shows {100} questions a page. "
            f"Per-token values are rounded to 0.01; {kept}. Role prompts are stored once.{left_out}{shared_note}")


def _sources(systems) -> str:
    return " · ".join(f"<bdi>{html.escape(s['name'])}</bdi>: <bdi>{html.escape(s['source'])}</bdi>" for s in systems)


def render_page(data: PageData, title: str = "mopd view") -> str:
    """The page's HTML. Text from records is only in the inlined JSON (``inline_json``: nothing in it
    can end its script element) and reaches the document as text nodes (the script sets
    ``textContent``); the rest is escaped here. Lone surrogates (no character) become U+FFFD."""
    return no_surrogates(TEMPLATE.format(
        title=html.escape(title), sources=_sources(data.systems), note=html.escape(size_note(data)),
        css=(ASSETS / "viewer.css").read_text(encoding="utf-8"), data=data.as_json(),
        js=(ASSETS / "viewer.js").read_text(encoding="utf-8")))


def fixed_bytes(title: str, systems) -> int:
    """Bytes of the page that are not its data: the template, style and script, the title and the
    sources line, and room for the note (``--max-mb`` bounds the whole file: the data gets the rest)."""
    empty = PageData(systems=[dict(s) for s in systems])
    return len(render_page(empty, title).encode()) - len(empty.as_json().encode()) + NOTE_ROOM


def write_page(data: PageData, out: str | os.PathLike, title: str = "mopd view") -> Path:
    """Write the page atomically; returns its path."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_page(data, title))
    return path
