"""Finding recipes (:mod:`mopd.recipes`) without naming them: one loader that every caller shares.

A recipe registers its presets, stage kinds, report kinds, engines, rewards and commands when it is
imported. The core never imports one by name; :func:`load_recipes` imports every package under
``mopd/recipes/`` and every module declared under the ``mopd.recipes`` entry-point group (a recipe
in another distribution), once per process. Every :class:`mopd.core.registry.Registry` calls it
before it is read (listed or looked up), and the command line calls it before it offers the
recipes' commands (:func:`recipe_command_modules`), so ``python -c`` and ``mopd`` see the same names.

A recipe that fails to import costs one warning line on stderr naming it and its error, and what it
registered before it failed is taken out again (a recipe loads whole or not at all); everything else
works. A registry that is asked for a name it does not hold names the recipes that failed
(:func:`failure_note`), since one of them may have provided it. Two recipes registering one name:
the second fails to load, with the registry's one-line refusal naming both.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from importlib.metadata import entry_points
from typing import Callable, Dict, List

PACKAGE = "mopd.recipes"
"""Where the bundled recipes live."""
ENTRY_POINT_GROUP = "mopd.recipes"
"""The entry-point group under which other distributions declare their recipe modules."""

_loaded: List[str] = []
_failed: Dict[str, str] = {}
_state = {"done": False, "loading": False}
_undo: List[List[Callable[[], None]]] = []   # one list per recipe being imported (the innermost last)


def recipe_names() -> List[str]:
    """Module names of every recipe: the bundled packages, then the entry points' modules."""
    folders = importlib.import_module(PACKAGE).__path__   # the package's folders (a test may add one)
    bundled = [f"{PACKAGE}.{m.name}" for m in pkgutil.iter_modules(folders) if m.ispkg]
    declared = [ep.value.split(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return list(dict.fromkeys(bundled + declared))


def load_recipes() -> List[str]:
    """Import every recipe (once per process), so each registers what it brings; returns the module
    names of those that loaded. A recipe that raises is reported in one warning line and skipped.
    A call made while the recipes are being imported (a recipe reading a registry) returns at once."""
    if _state["done"] or _state["loading"]:
        return list(_loaded)
    _state["loading"] = True
    try:
        for name in recipe_names():
            _import_whole(name)
    finally:
        _state["loading"] = False
        _state["done"] = True
    return list(_loaded)


def _import_whole(name: str) -> None:
    _undo.append([])
    try:
        importlib.import_module(name)
    except Exception as e:   # any error in a recipe: the core and the other recipes go on without it
        for undo in reversed(_undo[-1]):
            undo()
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
        _failed[name] = _one_line(e)
        print(f"mopd: warning: recipe {name} failed to load and is skipped: {_failed[name]}", file=sys.stderr)
    else:
        _loaded.append(name)
    finally:
        _undo.pop()


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def note_registration(undo: Callable[[], None]) -> None:
    """Called by a registry that has just added an entry: ``undo`` takes it out again if the recipe
    being imported (if any) fails later."""
    if _undo:
        _undo[-1].append(undo)


def failed_recipes() -> Dict[str, str]:
    """Recipes that failed to load in this process, with their one-line errors."""
    return dict(_failed)


def failure_note() -> str:
    """``"; recipe X failed to load (ERROR), it may provide it"`` for each recipe that failed (appended
    to an unknown name's error, since that recipe may have provided the name); ``''`` when none did."""
    if not _failed:
        return ""
    return "".join(f"; recipe {n} failed to load ({err}), it may provide it" for n, err in _failed.items())


def recipe_command_modules() -> List[str]:
    """The ``commands`` modules of the recipes that loaded and have one (each with
    ``register(subparsers)``)."""
    out = []
    for name in load_recipes():
        if importlib.util.find_spec(f"{name}.commands") is not None:
            out.append(f"{name}.commands")
    return out
