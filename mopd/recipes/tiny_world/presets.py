"""The ``tiny_*`` presets: the paper's method presets scaled to the tiny world's 0.7M-parameter
model on a 2-core CPU (larger lr, smaller batches, one PPO update per batch, shorter workflows;
every value and why: docs/method.md and docs/demo.md), and the check that says so when one of them
is about to train a larger model. The demo fills in the model, data, retriever and teacher paths.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from mopd.config import Config, TrainerConfig, get_preset, register_preset
from mopd.recipes.tiny_world.warmstart import WarmStartSettings
from mopd.train.model_checks import register_model_check


def _tiny(cfg: Config, steps: int) -> Config:
    # Why each value: docs/demo.md, "Why the tiny presets' values" (measured in bench/RESULTS.md).
    cfg.trainer = TrainerConfig(steps=steps, questions_per_step=12, ppo_minibatches=1, micro_batch_tokens=8192,
                                lr=5e-4, grad_clip=1.0, checkpoint_every=10, keep_checkpoints=1, val_every=5,
                                val_attempts=4, cpu_threads=1, old_logprobs="rollout", trace_every=5)
    cfg.rollout.temperature = 0.6
    cfg.rollout.group_size = 6
    cfg.rollout.answer_candidates = 4
    cfg.rollout.max_input_tokens = 2048
    cfg.rollout.max_output_tokens = 64
    cfg.data.dev_size = 40
    cfg.retriever.index = "bundled"   # unless an index is given: the demo passes its world's
    # float32 everywhere, GPU included: old_logprobs=rollout needs the engine's and the trainer's
    # log-probs to agree, which bf16 does not give (ROLLOUT_LOGPROBS_BF16); the 0.7M model costs nothing.
    cfg.model.dtype = "float32"
    # The published demo's bits were made with the padded SDPA batch: pinned here, so the core's CPU
    # default can be the faster packed attention (model.attn_implementation=auto).
    cfg.model.attn_implementation = "sdpa"
    cfg.description = "[tiny world] " + cfg.description
    return cfg


@register_preset
def tiny_cmas_rl() -> Config:
    """cmas_rl scaled for the built-in tiny world (the demo's Stage I)."""
    cfg = _tiny(get_preset("cmas_rl")(), steps=20)
    cfg.method = "tiny_cmas_rl"
    return cfg


def _tiny_stage2(base: Config, name: str) -> Config:
    cfg = _tiny(base, steps=20)
    cfg.method = name
    # Two departures from the paper's coefficients (no Leader assignment bonus, OPD beta 1 instead of
    # 0.01): docs/demo.md, "Why the tiny presets' values".
    cfg.reward.assign_coef = 0.0
    cfg.algo.roles["searcher"] = dataclasses.replace(cfg.algo.role("searcher"), opd_coef=1.0)
    cfg.rollout.max_steps = 8
    cfg.rollout.max_rounds = 3
    return cfg


@register_preset
def tiny_mopd() -> Config:
    """mopd scaled for the built-in tiny world (the demo's Stage II)."""
    return _tiny_stage2(get_preset("mopd")(), "tiny_mopd")


@register_preset
def tiny_no_searcher_supervision() -> Config:
    """no_searcher_supervision scaled for the built-in tiny world (the demo's primary control: the
    same Stage II as tiny_mopd, Searcher loss terms 0)."""
    return _tiny_stage2(get_preset("no_searcher_supervision")(), "tiny_no_searcher_supervision")


@register_preset
def tiny_outcome_searcher() -> Config:
    """outcome_searcher scaled for the built-in tiny world (the demo's ablation)."""
    return _tiny_stage2(get_preset("outcome_searcher")(), "tiny_outcome_searcher")


@register_preset
def tiny_base_teacher() -> Config:
    """base_teacher scaled for the built-in tiny world (the demo's ablation; set teacher.path to
    pi_0 and reference.path to the Stage-I model)."""
    return _tiny_stage2(get_preset("base_teacher")(), "tiny_base_teacher")


TINY_PRESETS = ("tiny_cmas_rl", "tiny_mopd", "tiny_no_searcher_supervision", "tiny_outcome_searcher",
                "tiny_base_teacher")


@register_model_check("tiny_preset")
def tiny_preset_mismatch(cfg, model) -> Optional[str]:
    """The line to say when a ``tiny_*`` preset, at its own learning rate, trains a model larger than
    the tiny world's pi_0 (:class:`~mopd.recipes.tiny_world.warmstart.WarmStartSettings`: hidden size
    128, 2 layers, 0.7M parameters): that lr (3e-4 and up) was chosen for that model and wrecks a real
    one. None when the preset is not a tiny one, the model is no larger, or ``trainer.lr`` was set."""
    if not cfg.method.startswith("tiny_") or cfg.method not in TINY_PRESETS:
        return None
    if cfg.trainer.lr != get_preset(cfg.method)().trainer.lr:
        return None
    tiny = WarmStartSettings()
    hidden = getattr(model.config, "hidden_size", 0)
    layers = getattr(model.config, "num_hidden_layers", 0)
    if hidden <= tiny.hidden and layers <= tiny.layers:
        return None
    n = sum(p.numel() for p in model.parameters())
    return (f"{cfg.method}: the tiny_* presets' learning rates (here trainer.lr={cfg.trainer.lr:g}) are for the "
            f"tiny world's 0.7M-parameter model, and {cfg.model.path} has {n / 1e6:.1f}M parameters (hidden size "
            f"{hidden}, {layers} layers): set trainer.lr (the paper's is 1e-6) or use the preset without tiny_")
