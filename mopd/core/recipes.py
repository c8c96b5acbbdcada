"""Finding recipes (:mod:`mopd.recipes`) without naming them.

A recipe registers its presets, stage kinds and commands when it is imported. The core never
imports one by name; it asks :func:`load_recipes`, which imports every package under
``mopd/recipes/`` and every module declared under the ``mopd.recipes`` entry-point group (a
recipe in another distribution), once. Registries call it when asked for a name they do not
hold, so ``mopd train PRESET`` finds a recipe's preset in any process, a torchrun worker
included; the command line calls :func:`recipe_command_modules` to offer their commands.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from importlib.metadata import entry_points
from pathlib import Path
from typing import List

PACKAGE = "mopd.recipes"
"""Where the bundled recipes live."""
ENTRY_POINT_GROUP = "mopd.recipes"
"""The entry-point group under which other distributions declare their recipe modules."""

_loaded: List[str] = []


def recipe_names() -> List[str]:
    """Module names of every recipe: the bundled packages, then the entry points' modules."""
    here = Path(__file__).resolve().parent.parent / "recipes"
    bundled = [f"{PACKAGE}.{m.name}" for m in pkgutil.iter_modules([str(here)]) if m.ispkg]
    declared = [ep.value.split(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return list(dict.fromkeys(bundled + declared))


def load_recipes() -> List[str]:
    """Import every recipe (once), so each registers what it brings; returns their module names."""
    if not _loaded:
        names = recipe_names()
        for name in names:
            importlib.import_module(name)
        _loaded.extend(names)
    return list(_loaded)


def recipe_command_modules() -> List[str]:
    """The ``commands`` modules of the recipes that have one (each with ``register(subparsers)``)."""
    out = []
    for name in recipe_names():
        spec = importlib.util.find_spec(f"{name}.commands")
        if spec is not None:
            out.append(f"{name}.commands")
    return out
