"""Checks of the loaded model against the run's config, registered by whoever knows what a preset
was made for (a recipe's presets, say): each says one line when the pair looks wrong (a learning
rate chosen for a 0.7M-parameter model, about to train a 4B one), and the trainer records it as an
event and prints it; none stops the run.

A check is ``fn(cfg, model) -> Optional[str]`` registered under an event kind with
:func:`register_model_check`.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

from mopd.core.registry import Registry

ModelCheck = Callable[[object, object], Optional[str]]

MODEL_CHECKS: Registry = Registry("model check")
"""Registered checks by the kind of the event they record."""


def register_model_check(kind: str):
    """Function decorator: run ``fn(cfg, model)`` when a trainer has loaded its model; a line it
    returns is recorded as an event of ``kind``."""
    return MODEL_CHECKS.register(kind)


def model_notices(cfg, model) -> List[Tuple[str, str]]:
    """(event kind, line) of every registered check that has something to say (the registry loads
    the recipes first, so a run of a recipe's preset meets its checks in any process)."""
    return [(kind, line) for kind, fn in MODEL_CHECKS.items() if (line := fn(cfg, model))]
