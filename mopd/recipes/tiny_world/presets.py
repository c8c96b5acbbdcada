"""The ``tiny_*`` presets: the paper's method presets scaled to the tiny world's 0.7M-parameter
model, and the check that says so when one of them is about to train a larger model."""

from __future__ import annotations

from typing import Optional

from mopd.config import PRESETS
from mopd.recipes.tiny_world.warmstart import WarmStartSettings
from mopd.train.model_checks import register_model_check


@register_model_check("tiny_preset")
def tiny_preset_mismatch(cfg, model) -> Optional[str]:
    """The line to say when a ``tiny_*`` preset, at its own learning rate, trains a model larger than
    the tiny world's pi_0 (:class:`~mopd.recipes.tiny_world.warmstart.WarmStartSettings`: hidden size
    128, 2 layers, 0.7M parameters): that lr (3e-4 and up) was chosen for that model and wrecks a real
    one. None when the preset is not a tiny one, the model is no larger, or ``trainer.lr`` was set."""
    if not cfg.method.startswith("tiny_") or cfg.method not in PRESETS:
        return None
    if cfg.trainer.lr != PRESETS[cfg.method]().trainer.lr:
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
