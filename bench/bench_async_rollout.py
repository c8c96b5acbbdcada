"""Asynchronous turn-level scheduling against lock-step rounds (DESIGN §7 target: async >= 1.5x the
tokens/s of lock-step at the paper's scale, simulated with a calibrated engine cost model).

1. ``test_simulated_stage2_step``: one Stage II step at the paper's scale (32 questions x 5
   trajectories of H-MAS, 12 steps, 5 rounds, 512-token outputs, 5 Answerer candidates) in the
   discrete-event simulation of ``bench/rollout_sim.py``, for lock-step and async. Runs are drawn
   from traces of H-MAS runs on a tiny world at the paper's limits with 64-token outputs (the step-by-
   step shape: turns, output lengths, searches), outputs scaled by 512/64: ``tiny_hmas_traces_pi0.json``
   (pi_0 sampling at T=1 on the HF engine) and ``tiny_hmas_traces.json`` (the scripted team pi_0
   imitates); made by ``python bench/recipes/tiny_world/hmas_traces.py WORLD MODEL OUT [scripted|model]``.
2. ``test_cpu_tiny_world``: both schedulers on the CPU, alternating in one process, on a tiny world
   with the HF engine and the retrieval server in its own process (``mopd retriever serve``).
   Needs a world and a model: ``MOPD_BENCH_WORLD`` (default /tmp/quick/world) and
   ``MOPD_BENCH_MODEL`` (default /tmp/quick/pi0), e.g. from ``mopd demo --quick --out /tmp/quick``.

3. ``test_simulated_waves_of_several_subtasks``: the same step with H-MAS waves of 1-4 subtasks
   (``rollout_sim.widen``), async with per-Searcher lanes against async whose waves move in steps.

Run: .venv/bin/pytest -q bench/bench_async_rollout.py -s
The printed numbers go by hand into the "Asynchronous rollout" section of bench/RESULTS.md.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rollout_sim import (  # noqa: E402
    CostModel,
    Retrieval,
    compare,
    load_traces,
    sample_runs,
    scaled,
    searcher_calls,
    simulate_async,
    simulate_lockstep,
    widen,
)

TRACES = {"pi_0 sampling": Path(__file__).parent / "data" / "tiny_hmas_traces_pi0.json",
          "scripted team": Path(__file__).parent / "data" / "tiny_hmas_traces.json"}
PAPER = {"questions": 32, "group": 5, "max_steps": 12, "max_rounds": 5, "max_output_tokens": 512,
         "answer_candidates": 5}
TINY_OUTPUT_CAP = 64
PROMPT_SCALE = 4.0
"""Prompt/passages scale: a tiny-world passage is ~25 tokens, a Wikipedia passage ~130 (x4-5)."""


def _row(name, res):
    return (f"{name:9s} wall {res.wall_s:7.2f} s  busy {res.busy_fraction:5.1%}  "
            f"mean rows {res.mean_rows:6.1f}  engine steps {res.engine_steps:6d}  {res.tokens:8d} tokens  "
            f"{res.tokens_per_s:8.0f} tok/s")


def test_simulated_stage2_step():
    n = PAPER["questions"] * PAPER["group"]
    scale = PAPER["max_output_tokens"] / TINY_OUTPUT_CAP
    variants = {
        "calibrated (Qwen3-4B, H200, E5 server)": (CostModel(), Retrieval()),
        "4x per-row cost": (CostModel(row_s=2e-5), Retrieval()),
        "H100 (3.35 TB/s)": (CostModel(weights_s=3.12e-3, kv_s_per_token=5.72e-8), Retrieval()),
        "slow retrieval (CPU FAISS, 0.5 s + 2 ms/query)": (CostModel(),
                                                           Retrieval(base_s=0.5, per_query_s=2e-3)),
    }
    calibrated = []
    for label, path in TRACES.items():
        traces, meta = load_traces(path)
        print(f"\n== {label}: {len(traces)} runs of {meta['source']}; {n} runs per step, outputs x{scale:g}")
        for name, (cost, retrieval) in variants.items():
            per_seed = [compare(sample_runs(traces, n, seed, scale, PROMPT_SCALE, PAPER["max_output_tokens"]),
                                cost, retrieval) for seed in range(3)]
            print(f"-- {name}")
            for mode in ("lockstep", "async", "async_lanes"):
                print("   " + _row(mode, per_seed[0][mode]))
            r = [p["async"].tokens_per_s / p["lockstep"].tokens_per_s for p in per_seed]
            print(f"   async / lock-step tokens/s over 3 draws: {', '.join(f'{x:.2f}' for x in r)}")
            if name.startswith("calibrated"):
                calibrated += r
    assert min(calibrated) > 1.0


def test_simulated_waves_of_several_subtasks():
    """The same Stage II step with waves of k subtasks (:func:`rollout_sim.widen`: each wave of a
    drawn run gets k-1 more Searcher calls drawn from all the traces' Searcher calls): async with
    per-Searcher lanes (the implementation) against async whose waves move one step at a time (the
    implementation before lanes), both against lock-step; 160 runs on one engine, and 20 (the
    step's runs spread over 8 engines). Medians and ranges over 6 draws."""
    import random
    import statistics

    scale = PAPER["max_output_tokens"] / TINY_OUTPUT_CAP
    variants = {"calibrated": (CostModel(), Retrieval()),
                "slow retrieval": (CostModel(), Retrieval(base_s=0.5, per_query_s=2e-3))}

    def summary(xs):
        return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"

    for label, path in TRACES.items():
        traces, _ = load_traces(path)
        pool = searcher_calls(traces)
        print(f"\n== {label}: {len(pool)} Searcher calls in the pool; outputs x{scale:g}")
        for n in (PAPER["questions"] * PAPER["group"], 20):
            for name, (cost, retrieval) in variants.items():
                for k in (1, 2, 3, 4):
                    rows = []
                    for seed in range(6):
                        rng = random.Random(seed)
                        runs = [scaled(widen(rng.choice(traces), k, pool, rng, PAPER["max_steps"]), scale,
                                       PROMPT_SCALE, PAPER["max_output_tokens"]) for _ in range(n)]
                        rows.append((simulate_lockstep(runs, cost, retrieval),
                                     simulate_async(runs, cost, retrieval),
                                     simulate_async(runs, cost, retrieval, lanes=True)))
                    assert all(row[2].tokens == row[0].tokens == row[1].tokens for row in rows)
                    if k == 1:  # a wave of one Searcher moves the same either way
                        assert all(row[2].wall_s == row[1].wall_s for row in rows)
                    steps = [row[1].tokens_per_s / row[0].tokens_per_s for row in rows]
                    lanes = [row[2].tokens_per_s / row[0].tokens_per_s for row in rows]
                    gain = [row[2].tokens_per_s / row[1].tokens_per_s for row in rows]
                    print(f"{n:4d} runs, {name:14s}, {k} subtask(s): async/lock-step tokens/s, "
                          f"waves in steps {summary(steps)}, lanes {summary(lanes)}; "
                          f"lanes/steps {summary(gain)}; busy "
                          f"{statistics.median(r[1].busy_fraction for r in rows):.1%} -> "
                          f"{statistics.median(r[2].busy_fraction for r in rows):.1%}")


# ----------------------------------------------------------------------------------------------
# CPU measurement on a tiny world
# ----------------------------------------------------------------------------------------------
WORLD = Path(os.environ.get("MOPD_BENCH_WORLD", "/tmp/quick/world"))
MODEL = Path(os.environ.get("MOPD_BENCH_MODEL", "/tmp/quick/pi0"))
ROUNDS = int(os.environ.get("MOPD_BENCH_ROUNDS", "3"))


class MeteredEngine:
    """Times generate() calls of the lock-step scheduler (the async fronts time themselves)."""

    def __init__(self, engine):
        self.engine, self.busy, self.calls, self.row_seconds = engine, 0.0, 0, 0.0
        self.tokenizer = engine.tokenizer

    def generate(self, requests):
        start = time.perf_counter()
        out = self.engine.generate(requests)
        dt = time.perf_counter() - start
        self.busy += dt
        self.calls += 1
        self.row_seconds += dt * sum(r.params.n for r in requests)
        return out

    def reset_prefix_cache(self):
        self.engine.reset_prefix_cache()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    if not (WORLD / "index" / "meta.json").is_file() or not (MODEL / "config.json").is_file():
        pytest.skip(f"needs a tiny world at {WORLD} and a model at {MODEL} "
                    "(mopd demo --quick --out /tmp/quick)")
    from mopd.retriever import HttpRetriever

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mopd", "retriever", "serve",
                             "--index", str(WORLD / "index"), "--port", str(port), "--device", "cpu"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = HttpRetriever(f"http://127.0.0.1:{port}", timeout_s=30, retries=0)
    try:
        for _ in range(240):
            try:
                client.health()
                break
            except Exception:
                time.sleep(0.5)
        else:
            raise RuntimeError("the retrieval server did not start")
        yield client
    finally:
        proc.terminate()
        proc.wait(30)


def test_cpu_tiny_world(server):
    """Retrieval by the HTTP server on its own process (2 client connections for async)."""
    _alternate(server, "server process", retrieval_workers=2)


def test_cpu_tiny_world_inprocess():
    """Retrieval by the in-process index (the demo's and the tests' setting)."""
    if not (WORLD / "index" / "meta.json").is_file() or not (MODEL / "config.json").is_file():
        pytest.skip(f"needs a tiny world at {WORLD} and a model at {MODEL}")
    from mopd.retriever import open_retriever

    _alternate(open_retriever(WORLD / "index"), "in-process index", retrieval_workers=1)


def _alternate(retriever, label: str, retrieval_workers: int) -> None:
    import statistics

    import torch

    from mopd.core.qa import load_flashrag
    from mopd.rollout.async_scheduler import run_workflows_async
    from mopd.rollout.hf_engine import HFEngine
    from mopd.rollout.run_state import WorkflowSettings
    from mopd.rollout.scheduler import run_workflows

    torch.set_num_threads(1)
    engine = HFEngine.from_pretrained(str(MODEL), device="cpu")
    questions = load_flashrag(WORLD / "questions" / "train.jsonl")[0][:int(os.environ.get("MOPD_BENCH_QUESTIONS", "16"))]
    settings = WorkflowSettings(workflow="hmas", max_steps=8, max_rounds=3, max_input_tokens=2048,
                                max_output_tokens=TINY_OUTPUT_CAP, answer_candidates=4, temperature=0.6,
                                seed=0, retrieval_workers=retrieval_workers)
    attempts = int(os.environ.get("MOPD_BENCH_ATTEMPTS", "4"))
    results = {"lockstep": [], "async": []}
    print(f"\n{label}: {len(questions)} questions x {attempts} H-MAS runs")
    for r in range(ROUNDS):
        for mode in (("lockstep", "async") if r % 2 == 0 else ("async", "lockstep")):
            start = time.perf_counter()
            if mode == "lockstep":
                metered = MeteredEngine(engine)
                recs = run_workflows(metered, retriever, engine.tokenizer, questions, settings,
                                     attempts=attempts, progress=False)
                wall = time.perf_counter() - start
                busy, rows = metered.busy / wall, metered.row_seconds / max(metered.busy, 1e-9)
            else:
                recs = run_workflows_async(engine, retriever, engine.tokenizer, questions, settings,
                                           attempts=attempts, progress=False)
                wall = time.perf_counter() - start
                busy, rows = recs.stats.busy_fraction, recs.stats.mean_batch_rows
            tokens = sum(x.output_tokens for x in recs)
            searches = sum(x.search_actions for x in recs)
            results[mode].append((wall, tokens, busy, rows, searches))
            print(f"round {r} {mode:8s}: {wall:6.2f} s  {tokens} tokens  {tokens / wall:7.1f} tok/s  "
                  f"busy {busy:5.1%}  mean rows {rows:5.1f}  searches {searches}")
    best = {m: max(t / w for w, t, *_ in v) for m, v in results.items()}
    pairs = [a[1] / a[0] / (b[1] / b[0]) for a, b in zip(results["async"], results["lockstep"])]
    print(f"best tokens/s: lock-step {best['lockstep']:.1f}, async {best['async']:.1f}, "
          f"ratio {best['async'] / best['lockstep']:.2f}; per-round ratios "
          + ", ".join(f"{p:.2f}" for p in pairs) + f"; median {statistics.median(pairs):.2f}")
