"""The viewer at scale: 20,000 synthetic H-MAS workflows (2 systems x 2,500 questions x 4 attempts),
every call with token ids and sampling log-probs (an evaluation run with --keep-token-ids: the
largest records there are), written into one page and opened and filtered in headless Chromium.

Run: .venv/bin/python bench/bench_view.py [--workflows 20000] [--keep DIR]
Needs Debian's chromium and chromium-driver and selenium (`make test-browser` installs them).

Times: reading the records (json.loads of every line: the baseline, in the same process), building
the page data (trees, token pieces, compression), writing the file; in the browser, from navigation
to a usable list (the page's data parsed, the first page of rows drawn), each filter's redraw, a
text search, and opening one question (two workflows inflated and drawn).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from mopd.core.roles import role
from tests.helpers.tiny_model import init_tiny_model
from mopd.view.page import write_page
from mopd.view.page_data import build_page_data
from mopd.view.sources import open_source

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests.helpers, without PYTHONPATH=.
from tests.helpers.browser import chromium, wait_for  # noqa: E402

DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")
WORDS = ("band town river formed album founded city singer year record label north old new first second "
         "the of in was by and a to").split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _segment(rng, source, text, tokens):
    ids = [rng.randrange(5, 390) for _ in range(tokens)]
    return {"token_ids": ids, "source": source, "text": text,
            "logprobs": [round(-rng.random() * 3, 4) for _ in ids] if source == "model" else None}


def _call(rng, cid, name, step, turns, parent=""):
    segs = [_segment(rng, "env", role(name).system_prompt + "\nQuestion: " + parent, 300)]
    for t in range(turns):
        if t:
            segs.append(_segment(rng, "env", "<information>" + _text(rng, 150) + "</information>", 200))
        segs.append(_segment(rng, "model", f"<search>{_text(rng, 5)}</search>", 24))
    return {"call_id": cid, "role": name, "segments": segs, "step": step, "group": "g" if name == "answerer" else "",
            "parent": parent, "input_tokens": 300 * turns, "output_tokens": 24 * turns,
            "invalid": rng.random() < 0.05, "finish_reasons": ["stop"] * turns, "truncated_input": False}


def synthetic_record(rng: random.Random, system: int, q: int, attempt: int) -> dict:
    searchers = rng.randint(0, 3)
    calls = [_call(rng, "l0", "leader", 1, 2, "question")]
    calls += [_call(rng, f"s0.{i}", "searcher", 2, rng.randint(1, 3), _text(rng, 8)) for i in range(searchers)]
    calls.append(_call(rng, "a0.0", "answerer", 4, 1, "question"))
    events = [{"kind": "subtask", "step": 1, "call_id": "l0", "text": c["parent"], "passages": [], "selection": []}
              for c in calls if c["role"] == "searcher"]
    for c in calls:
        if c["role"] == "searcher":
            events.append({"kind": "search", "step": 2, "call_id": c["call_id"], "text": _text(rng, 5),
                           "passages": [{"id": str(k), "title": _text(rng, 2), "text": _text(rng, 100)}
                                        for k in range(3)], "selection": []})
            events.append({"kind": "report", "step": 3, "call_id": c["call_id"], "text": _text(rng, 20),
                           "passages": [], "selection": []})
    answer = rng.choice(["Paris", "Lyon", "Town"])
    return {"question_id": f"q{q}", "dataset": DATASETS[q % len(DATASETS)], "question": _text(rng, 12) + "?",
            "answers": ["Paris"], "attempt": attempt, "group_id": "", "method": f"system{system}", "workflow": "hmas",
            "calls": calls, "events": events, "candidates": [f"<answer>{answer}</answer>"], "final_answer": answer,
            "steps": 4, "duration_s": 1.0, "schema_version": 1}


def write_runs(root: Path, workflows: int) -> list:
    model = init_tiny_model(root / "model")
    dirs = []
    per_system = workflows // 2
    for s in range(2):
        rng = random.Random(s)
        d = root / f"system{s}"
        d.mkdir(parents=True)
        with (d / "records.jsonl").open("w") as f:
            for i in range(per_system):
                f.write(json.dumps(synthetic_record(rng, s, i // 4, i % 4)) + "\n")
        (d / "run.json").write_text(json.dumps({"settings": {}, "model": str(model)}))
        dirs.append(d)
    return dirs


def timed(driver, action: str, ready: str) -> float:
    """Seconds from running ``action`` (JavaScript) until ``ready`` holds, measured in the page."""
    driver.execute_script("window.__t0 = performance.now();" + action)
    wait_for(driver, ready, timeout=120)
    return driver.execute_script("return (performance.now() - window.__t0) / 1000")


def synchronous(driver, action: str) -> float:
    """Seconds of a filter's redraw (the handlers run synchronously; layout forced before the clock stops)."""
    return driver.execute_script("const t0 = performance.now();" + action +
                                 "document.body.offsetHeight; return (performance.now() - t0) / 1000")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workflows", type=int, default=20000)
    ap.add_argument("--keep", default=None, help="write into this directory (kept) instead of a temporary one")
    args = ap.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="mopd-bench-view-"))
    root.mkdir(parents=True, exist_ok=True)
    dirs = write_runs(root, args.workflows)
    records_mib = sum((d / "records.jsonl").stat().st_size for d in dirs) / 2 ** 20
    t = time.perf_counter()
    for d in dirs:
        with (d / "records.jsonl").open("rb") as f:
            for line in f:
                json.loads(line)
    read_s = time.perf_counter() - t
    t = time.perf_counter()
    data = build_page_data([open_source(str(d)) for d in dirs])
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    page = write_page(data, root / "view.html")
    write_s = time.perf_counter() - t
    page_mib = page.stat().st_size / 2 ** 20
    out = {"machine": f"{platform.processor() or platform.machine()}, {len(__import__('os').sched_getaffinity(0))} "
                      "cores", "date": time.strftime("%Y-%m-%d"), "workflows": len(data.workflows),
           "questions": len(data.questions), "records_mib": round(records_mib, 1), "page_mib": round(page_mib, 1),
           "with_tokens": data.with_tokens, "read_records_s": round(read_s, 2), "build_s": round(build_s, 2),
           "write_s": round(write_s, 2), "build_vs_read": round((build_s + write_s) / read_s, 2)}
    with chromium() as driver:
        t = time.perf_counter()
        driver.get(page.as_uri())
        wait_for(driver, "document.body.dataset.ready === '1'", timeout=300)
        out["open_s"] = round(time.perf_counter() - t, 2)
        change = "const e = document.getElementById('{id}'); e.value = '{v}'; e.dispatchEvent(new Event('change'));"
        out["filter_dataset_s"] = round(synchronous(driver, change.format(id="f-dataset", v="nq")), 3)
        out["filter_unsolved_s"] = round(synchronous(driver, change.format(id="f-solved", v="unsolved")), 3)
        out["filter_role_s"] = round(synchronous(driver, change.format(id="f-role", v="searcher")), 3)
        out["sort_difference_s"] = round(synchronous(driver, change.format(id="f-sort", v="diff")), 3)
        out["shown_after_filters"] = driver.execute_script("return document.getElementById('count').textContent")
        out["text_search_s"] = round(timed(
            driver, "window.__n = document.getElementById('count').textContent;"
                    "const e = document.getElementById('f-text'); e.value = 'river'; "
                    "e.dispatchEvent(new Event('input'));",
            "document.getElementById('count').textContent !== window.__n"), 3)   # with the 150 ms debounce
        out["open_question_s"] = round(timed(
            driver, "document.getElementById('detail').dataset.ready = '';"
                    "document.querySelector('#list-body tr.qrow').click();",
            "document.getElementById('detail').dataset.ready !== ''"), 3)
        out["tokens_drawn"] = driver.execute_script("return document.querySelectorAll('#detail .tok').length")
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        out["console_errors"] = len(errors)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
