"""Traces of H-MAS runs on the tiny world at the paper's limits, which bench/bench_async_rollout.py's
simulation draws its runs from (``bench/data/tiny_hmas_traces*.json``): the recipe's own bench
tool, beside the core's benches (a recipe's benches, like its tests, may import it).

Run: PYTHONPATH=. python bench/recipes/tiny_world/hmas_traces.py WORLD MODEL_DIR OUT [scripted|model]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # bench/, for rollout_sim and the limits
from bench_async_rollout import PAPER, TINY_OUTPUT_CAP  # noqa: E402


def make_traces(world: Path, model_dir: Path, out: Path, attempts: int = 3, policy: str = "scripted") -> None:
    """H-MAS runs on the tiny world's training questions at the paper's limits (12 steps, 5 rounds,
    5 candidates; 64-token outputs, the tiny presets' cap), as step traces. ``policy``: 'scripted'
    (the tiny world's scripted team, with ``model_dir``'s tokenizer) or 'model' (the model in
    ``model_dir`` on the HF engine, sampling at temperature 1)."""
    import torch
    from rollout_sim import save_traces, trace_runs
    from transformers import AutoTokenizer

    from mopd.recipes.tiny_world.scripted_policy import DemoEngine, DemoStyle, world_policy
    from mopd.recipes.tiny_world.world import WorldPaths, load_split
    from mopd.retriever import open_retriever
    from mopd.rollout.hf_engine import HFEngine
    from mopd.rollout.run_state import WorkflowSettings

    torch.set_num_threads(1)
    paths = WorldPaths.of(world)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if policy == "scripted":
        engine = DemoEngine(world_policy(paths.root, DemoStyle()), tokenizer, seed=0)
        source = f"the scripted tiny-world team (DemoStyle defaults), H-MAS, {world}"
    else:
        engine = HFEngine.from_pretrained(str(model_dir), device="cpu")
        source = f"pi_0 {model_dir} sampling at T=1 on the HF engine, H-MAS, {world}"
    settings = WorkflowSettings(workflow="hmas", max_steps=PAPER["max_steps"], max_rounds=PAPER["max_rounds"],
                                max_output_tokens=TINY_OUTPUT_CAP,
                                answer_candidates=PAPER["answer_candidates"], temperature=1.0, seed=0)
    traces = trace_runs(engine, open_retriever(world / "index"), tokenizer, load_split(paths, "train"),
                        settings, attempts=attempts)
    save_traces(out, traces, {"source": source,
                              "settings": {"max_steps": settings.max_steps, "max_rounds": settings.max_rounds,
                                           "max_output_tokens": TINY_OUTPUT_CAP,
                                           "answer_candidates": settings.answer_candidates},
                              "attempts": attempts})
    print(f"{len(traces)} traces -> {out}")


if __name__ == "__main__":
    # python bench/recipes/tiny_world/hmas_traces.py WORLD MODEL_DIR OUT [scripted|model]
    make_traces(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]),
                policy=sys.argv[4] if len(sys.argv) > 4 else "scripted")
