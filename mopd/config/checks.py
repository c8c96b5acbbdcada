"""The checks every config dataclass runs in ``__post_init__`` (the run's, :mod:`mopd.config`, and a
pipeline's, :mod:`mopd.pipeline.config`), each a one-line :class:`ConfigError` that names the key."""

from __future__ import annotations

import dataclasses
import math
import os

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


PATH_KEYS = ("model.path", "teacher.path", "reference.path", "data.train", "data.dev", "retriever.index",
             "retriever.token_file", "trainer.out_dir")
"""The run's settings that name files or directories (:func:`fitting_paths` checks them)."""
NAME_MAX = 255
"""Bytes of one file name that Linux file systems (ext4, xfs, btrfs, tmpfs, NFS) accept."""
PATH_MAX = 4096
"""Bytes of a whole path the kernel accepts."""


def path_fits(name: str, value: str) -> None:
    """``value`` can name a file: no NUL byte, no name in it past NAME_MAX bytes, the whole under
    PATH_MAX (else every open or stat of it is an ``OSError`` traceback, far from the setting)."""
    if not value:
        return
    if "\0" in value:
        raise ConfigError(f"{name}: the path holds a NUL byte, which no file name can")
    raw = os.fsencode(value)
    if len(raw) >= PATH_MAX:
        raise ConfigError(f"{name}: the path is {len(raw)} bytes long; the system takes at most {PATH_MAX - 1}")
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        shown = os.fsdecode(longest[:24])
        raise ConfigError(f"{name}: the name {shown!r}... in the path is {len(longest)} bytes long; a file name "
                          f"is at most {NAME_MAX} bytes")


def fitting_paths(cfg) -> None:
    """:func:`path_fits` for every :data:`PATH_KEYS` setting of a run config."""
    for key in PATH_KEYS:
        section, field = key.split(".")
        value = getattr(getattr(cfg, section, None), field, None)
        if isinstance(value, str):
            path_fits(key, value)
