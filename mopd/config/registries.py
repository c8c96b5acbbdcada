"""The names a config may choose, each declared once, by the code that implements it.

- :data:`ENGINES` (``rollout.engine``): builders of rollout engines, registered in
  :mod:`mopd.rollout.engines` (``@register_engine("hf")``).
- :data:`REWARDS` (``reward.roles.<role>``): reward classes, registered in :mod:`mopd.algo.rewards`
  (``@register_reward("team_bonus")``).
- :data:`PRESETS` (``mopd train NAME``): functions returning a :class:`~mopd.config.Config`,
  registered under their own name (``@register_preset``) in :mod:`mopd.config.presets` and by any
  module outside the config package (a recipe's presets); :func:`get_preset` looks one up. Every
  registry loads the recipes before it is read (:mod:`mopd.core.registry`), so a recipe's
  engines, rewards and presets are seen by every caller.
- Workflows are the core's table (:mod:`mopd.core.workflows`: their roles and step limits, which the
  presets read); each state machine registers against it in :mod:`mopd.rollout` (``run_state``).

Why the registries live here while their entries register from layer 3: the config checks a name in
``__post_init__`` (so every config is checked, whoever builds it: ``resolve``, a preset, a pipeline
stage, a test), and it may import nothing above the core. The modules that register the built-in
engines and rewards are small (no torch) and the package's top, ``mopd/__init__.py``, imports them,
so the registries are full before any module of ``mopd`` runs: a bad name is a one-line
``ConfigError`` naming the valid ones when the config is resolved, before any model loads. A new
engine or reward is one new class or builder with its ``register_*`` decorator, in a module that
is imported before configs are built (a built-in one: imported by ``mopd/__init__.py``).
"""

from __future__ import annotations

from typing import Callable, Tuple

from mopd.config.checks import ConfigError
from mopd.core.registry import Registry

ENGINES: Registry = Registry("engine", error=ConfigError)
"""Rollout engines by name: ``build(rollout_cfg, model_path, *, dtype, device, trainer_model)``
returning an :class:`~mopd.rollout.engine.Engine` (:func:`mopd.rollout.engines.build_engine`)."""

REWARDS: Registry = Registry("reward", error=ConfigError)
"""Role rewards by name: classes with ``from_config(reward_cfg)`` (:mod:`mopd.algo.rewards`)."""

PRESETS: Registry = Registry("preset", error=ConfigError)
"""Method presets by name: functions returning a :class:`~mopd.config.Config`. Read it as a
mapping (``PRESETS[name]()``, ``PRESETS.items()``); add to it with :func:`register_preset`."""


def register_engine(name: str):
    """Decorator: register an engine builder under ``name`` (``rollout.engine=name``)."""
    return ENGINES.register(name)


def register_reward(name: str):
    """Decorator: register a reward class under ``name`` (``reward.roles.<role>=name``)."""
    return REWARDS.register(name)


def register_preset(fn: Callable) -> Callable:
    """Decorator: register a function returning a Config under its own name (declared once)."""
    return PRESETS.register(fn)


def get_preset(name: str) -> Callable:
    """The preset function called ``name``; a one-line ConfigError naming the presets if none, and
    one naming the preset and its recipe if calling it raises (:meth:`Registry.builder`)."""
    return PRESETS.builder(name)


def preset_names() -> Tuple[str, ...]:
    """Every registered preset's name, in registration order."""
    return PRESETS.names()
