"""`mopd demo`: the whole method end to end on the built-in tiny world, on a laptop CPU.

The demo is a pipeline (:mod:`mopd.pipeline`) run in this process: world -> retrieval index ->
pi_0 (SFT warm start, 2 threads) -> its dev check -> Stage I (tiny_cmas_rl, 2 threads) -> export as
teacher -> Stage II arms from pi_0, side by side in processes of one thread (tiny_mopd and its
control tiny_no_searcher_supervision; with ablations also tiny_outcome_searcher and
tiny_base_teacher), each exported at its last step -> evaluation of C-MAS base, C-MAS + RL, H-MAS
base and every arm with the paper's protocol (4 attempts, question bootstrap) -> report with plots
and claims. :func:`mopd.recipes.tiny_world.pipeline.demo_pipeline` turns `mopd demo`'s options into that
pipeline; `mopd pipeline demo` runs the same at the defaults.
Every step reuses what an earlier run already built in the same directory (world, pi_0, finished
stages, finished evaluations), so a second run is quick and a killed run resumes. What the report
says, and the multi-seed summary, are rendered by :mod:`mopd.recipes.tiny_world.report`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import List

from mopd.pipeline.config import PipelineConfig
from mopd.pipeline.presets import resolve_pipeline
from mopd.pipeline.run import run_pipeline
from mopd.recipes.tiny_world.pipeline import DemoSettings, demo_pipeline
from mopd.recipes.tiny_world.report import log, write_seed_summary


def demo_config(s: DemoSettings) -> PipelineConfig:
    """The resolved pipeline of a demo with settings ``s``."""
    return resolve_pipeline(demo_pipeline(s))


def run_demo(s: DemoSettings) -> Path:
    """Run every stage (reusing finished ones); returns the report's path.

    Nothing before the final evaluation reads the evaluation split: pi_0 trains on the training
    split, its check and both stages' validation curves use the dev split."""
    cfg = demo_config(s)
    root = Path(cfg.root)
    refuse_another_mode(root, s)
    root.mkdir(parents=True, exist_ok=True)
    (root / "demo_settings.json").write_text(json.dumps(dataclasses.asdict(s), indent=2))
    return run_pipeline(cfg)


def mode_of(settings: dict) -> str:
    """``full``, ``quick``, ``LoRA`` or ``LoRA quick``: what a demo's settings (its
    ``demo_settings.json``) say it builds."""
    words = ["LoRA"] * bool(settings.get("lora")) + ["quick"] * bool(settings.get("quick"))
    return " ".join(words) or "full"


def refuse_another_mode(root: Path, s: DemoSettings) -> None:
    """A demo directory that another mode built (a quick run's world and pi_0 are not the full
    demo's, and rebuilding them would delete 12-25 minutes of work) is refused in one line, never
    rebuilt: each mode has its own default directory."""
    from mopd.core.errors import UserError

    try:
        recorded = json.loads((root / "demo_settings.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):   # none yet (or unreadable: nothing of a mode to protect)
        return
    if not isinstance(recorded, dict):
        return
    theirs, ours = mode_of(recorded), mode_of(dataclasses.asdict(s))
    if theirs != ours:
        raise UserError(f"{root} holds a {theirs} demo; a {ours} run would rebuild its world and pi_0: give it "
                        f"its own directory (--out; by default each mode has one), or remove {root} first")


def run_seeds(s: DemoSettings, seeds: List[int]) -> Path:
    """The demo on each of ``seeds`` (``s.out``/seed{N}, finished stages reused), then the
    multi-seed summary (``s.out``/summary.json and summary.md); returns the summary's path."""
    root = Path(s.out)
    for n in seeds:
        log(f"seed {n}: {root / f'seed{n}'}")
        run_demo(dataclasses.replace(s, seed=n, out=str(root / f"seed{n}")))
    return write_seed_summary(root, seeds, draws=s.bootstrap_draws, split=s.eval_split)
