"""The checks every config dataclass runs in ``__post_init__`` (the run's, :mod:`mopd.config`, and a
pipeline's, :mod:`mopd.pipeline.config`), each a one-line :class:`ConfigError` that names the key."""

from __future__ import annotations

import dataclasses
import math

from mopd.core.recipes import failure_note


class ConfigError(ValueError):
    """A bad key, type or value in a run (or pipeline) configuration."""


def choice(name: str, value, choices) -> None:
    """``value`` is one of ``choices`` (any iterable of names: a tuple, a set, a registry, which
    loads the recipes first); the refusal names the recipes that failed to load, if any."""
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of {sorted(choices)}{failure_note()}")


def positive(name: str, value, allow_zero: bool = False) -> None:
    """``value`` > 0 (>= 0 with ``allow_zero``); None is refused."""
    if value is None or (value < 0 if allow_zero else value <= 0):
        raise ConfigError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


def finite_floats(obj, prefix: str = "") -> None:
    """Refuse NaN and infinite floats anywhere in a (nested) config dataclass: every range check
    compares, and a comparison with NaN is false, so ``trainer.lr=nan`` would pass them all and fail
    later inside AdamW or the loss kernel."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            finite_floats(value, f"{prefix}{f.name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{f.name}={value} must be a finite number")
