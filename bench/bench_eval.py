"""Evaluation report speed: 100,000 workflow records (5 systems x 7 datasets x 714 questions x 4
attempts, the paper's scale) and 4,000 paired bootstrap draws.

Run: .venv/bin/pytest -q bench/bench_eval.py --benchmark-only
The baseline is a plain per-draw loop that gathers the resampled questions of every dataset
(the obvious implementation), timed on 100 draws and scaled to 4,000.
"""

import random
import time

import numpy as np
import pytest

from mopd.core.records import AgentCall, Event, Passage, WorkflowRecord, read_records, write_records
from mopd.eval.alignment import align_runs
from mopd.eval.bootstrap import paired_intervals
from mopd.eval.loading import read_eval_records
from mopd.eval.metrics import outcomes, question_metrics
from mopd.eval.report import load_runs, write_report
from mopd.eval.summary import summarize

SYSTEMS = 5
DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")
QUESTIONS_PER_DATASET = 714
ATTEMPTS = 4
DRAWS = 4000


def _records(system: int, rng: random.Random):
    p = 0.3 + 0.05 * system
    out = []
    for d in DATASETS:
        for i in range(QUESTIONS_PER_DATASET):
            for a in range(ATTEMPTS):
                u = rng.random()
                cand = ("<answer>Paris</answer>" if u < p else "<answer>Lyon</answer>" if u < 0.9
                        else "Paris" if u < 0.95 else "")
                n = rng.randint(0, 4)
                out.append(WorkflowRecord(
                    question_id=f"{d}-{i}", dataset=d, question="q?", answers=["Paris"], attempt=a,
                    workflow="hmas" if system % 2 else "cmas",
                    calls=[AgentCall("s0", "searcher", input_tokens=rng.randint(500, 9000),
                                     output_tokens=300)],
                    events=[Event("search", 1, text="x", passages=[Passage("p", "t")] * 3) for _ in range(n)]
                    + [Event("report", 2, text="r")],
                    candidates=[cand] if u < 0.98 else []))
    return out


@pytest.fixture(scope="module")
def runs():
    rng = random.Random(0)
    return {f"sys{s}": _records(s, rng) for s in range(SYSTEMS)}


@pytest.fixture(scope="module")
def stats(runs):
    aligned = align_runs(runs)
    m = question_metrics(outcomes(aligned).strict)
    return np.stack([m["avg"], m["pass"], m["all"]], 1), aligned.dataset_index, len(aligned.datasets)


def test_record_count(runs):
    assert sum(len(r) for r in runs.values()) == SYSTEMS * len(DATASETS) * QUESTIONS_PER_DATASET * ATTEMPTS


def test_bootstrap_4000_draws(benchmark, stats):
    values, di, d = stats
    benchmark.pedantic(paired_intervals, args=(values, di, d, 0), kwargs={"draws": DRAWS, "seed": 1},
                       rounds=3, iterations=1)


def test_bootstrap_naive_loop_baseline(benchmark, stats):
    """Per-draw gather of the resampled questions (100 draws; multiply by 40 for 4,000)."""
    values, di, d = stats
    rows = [np.flatnonzero(di == j) for j in range(d)]

    def naive(draws=100):
        rng = np.random.default_rng(1)
        out = np.empty((draws,) + values.shape[:2])
        for b in range(draws):
            out[b] = np.mean([values[:, :, r[rng.integers(0, len(r), len(r))]].mean(-1) for r in rows], 0)
        return np.percentile(out, [2.5, 97.5], axis=0)

    benchmark.pedantic(naive, rounds=3, iterations=1)


@pytest.fixture(scope="module")
def one_file(runs, tmp_path_factory):
    f = tmp_path_factory.mktemp("bench_eval_one") / "records.jsonl"
    write_records(f, runs["sys0"])
    return f


def test_read_20k_records_strict_loader_baseline(benchmark, one_file):
    """The trainer's loader (every field checked), one system's 20,000 records."""
    benchmark.pedantic(read_records, args=(one_file,), rounds=1, iterations=1)


def test_read_20k_records_eval_loader(benchmark, one_file):
    benchmark.pedantic(read_eval_records, args=(one_file,), rounds=1, iterations=1)


def test_summarize_100k_records(benchmark, runs):
    """Align, score every workflow (strict + flexible), 4,000 paired draws, costs, diagnostics."""
    benchmark.pedantic(summarize, args=(runs,), kwargs={"draws": DRAWS}, rounds=1, iterations=1)


def test_full_report_from_jsonl(benchmark, runs, tmp_path_factory):
    """What `mopd eval report` does: read 5 JSONL files, summarise, write report.md/metrics.json/PNGs."""
    root = tmp_path_factory.mktemp("bench_eval")
    paths = []
    for name, recs in runs.items():
        write_records(root / name / "records.jsonl", recs)
        paths.append(root / name)

    def full():
        t0 = time.perf_counter()
        loaded = load_runs(paths)
        t1 = time.perf_counter()
        s = summarize(loaded, draws=DRAWS)
        t2 = time.perf_counter()
        write_report(s, root / "report")
        t3 = time.perf_counter()
        print(f"\nread {t1 - t0:.1f}s, summarize {t2 - t1:.1f}s, write report {t3 - t2:.1f}s")

    benchmark.pedantic(full, rounds=1, iterations=1)
