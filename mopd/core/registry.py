"""A name -> object table that the modules implementing the objects fill in (torchtitan's and verl's
registries): presets, pipelines, engines, rewards, workflow state machines.

A registry is declared once, low in the layers (where the config can read its names); each entry
registers itself where it is implemented, with :meth:`Registry.register` as a decorator::

    ENGINES = Registry("engine")

    @ENGINES.register("hf")          # an explicit name
    def build_hf(...): ...

    @PRESETS.register                # the function's own name
    def mopd() -> Config: ...

It reads as a read-only mapping (``name in r``, ``r[name]``, ``r.items()``, ``sorted(r)``), and
:meth:`Registry.lookup` is the lookup that fails in one line naming the valid choices.

A listing, and a read of a name it does not hold, first load the recipes
(:func:`mopd.core.recipes.load_recipes`, once per process), so a recipe's entries are seen the same
way by every caller: the command line, a config check, ``python -c``. A name it holds is read
without them (no recipe can take a registered name, so the answer is the same), so a command that
names only the core's entries never imports a recipe. What a recipe registers is taken out again
if it fails to import.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from typing import Dict, Generic, Iterator, Optional, Tuple, Type, TypeVar, Union

from mopd.core.recipes import failure_note, load_recipes, note_registration, recipe_of

T = TypeVar("T")


class Registry(Mapping, Generic[T]):
    """Objects by name. ``kind`` names an entry in errors (``unknown engine 'x'``); ``error`` is the
    exception :meth:`lookup` raises (a ValueError subclass: the config passes its ConfigError).
    A listing, or a read of a name it lacks, loads the recipes first (the module docstring)."""

    def __init__(self, kind: str, plural: str = "", error: Type[ValueError] = ValueError):
        self.kind = kind
        self.plural = plural or f"{kind}s"
        self.error = error
        self._entries: Dict[str, T] = {}

    def register(self, name: Union[str, T], obj: Optional[T] = None):
        """``register("name")`` or ``register("name", obj)``: the decorator, or the call, that adds
        ``obj`` under ``name``; ``register(fn)`` adds ``fn`` under its own ``__name__``. Adding the
        same object again (or a reloaded copy of it) is a no-op; another object under a taken name
        is refused."""
        if not isinstance(name, str):
            return self.register(name.__name__, name)
        if obj is None:
            return lambda o: self.register(name, o)
        if not name or not name.isidentifier():
            raise ValueError(f"{self.kind} name {name!r} must be an identifier")
        old = self._entries.get(name)
        if old is not None and not _same(old, obj):
            raise ValueError(f"{self.kind} {name!r} is registered twice: by {_qualname(old)} and by {_qualname(obj)}")
        if old is None:
            note_registration(lambda: self._entries.pop(name, None))
        self._entries[name] = obj
        return obj

    def unregister(self, name: str) -> None:
        """Take ``name`` out again (tests that add an entry of their own)."""
        self._entries.pop(name, None)

    def names(self) -> Tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._read())

    def held(self) -> Tuple[Tuple[str, T], ...]:
        """``(name, entry)`` of what it holds now, without loading the recipes: before they load, the
        core's own entries (``mopd config list`` shows them before any recipe is imported)."""
        return tuple(self._entries.items())

    def lookup(self, name: str) -> T:
        """The entry called ``name``; a one-line ``error`` naming the close match and every valid
        name when there is none (and the recipes that failed to load, which may have provided it)."""
        if name in self._entries:
            return self._entries[name]
        entries = self._read()
        if name not in entries:
            close = difflib.get_close_matches(str(name), entries, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise self.error(f"unknown {self.kind} {name!r}{hint}; {self.plural}: {sorted(entries)}{failure_note()}")
        return entries[name]

    def builder(self, name: str):
        """:meth:`lookup`'s entry (a function that builds something: a preset) wrapped so that
        whatever it raises when called (a recipe's bug, an exit) is one line of ``error`` naming the
        entry and where it comes from: ``preset 'x' (recipe mopd.recipes.r) failed to build: ...``.
        A Ctrl-C still interrupts."""
        fn = self.lookup(name)

        @functools.wraps(fn)
        def build(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (Exception, SystemExit) as e:   # a plug-in's failure of any kind but the user's Ctrl-C
                module = getattr(fn, "__module__", None) or "?"
                recipe = recipe_of(module)
                where = f"recipe {recipe}" if recipe else module
                text = " ".join(str(e).split())
                raise self.error(f"{self.kind} {name!r} ({where}) failed to build: {type(e).__name__}"
                                 f"{': ' + text if text else ''}") from None

        return build

    def _read(self) -> Dict[str, T]:
        load_recipes()
        return self._entries

    def __getitem__(self, name: str) -> T:
        if name in self._entries:
            return self._entries[name]
        return self._read()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._read()))

    def __len__(self) -> int:
        return len(self._read())

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._read()

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"


def _qualname(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _same(old, new) -> bool:
    """``new`` is ``old``, equal to it, or the same named function or class of a module imported again."""
    if old is new or old == new:
        return True
    named = hasattr(old, "__qualname__") and hasattr(new, "__qualname__") and "<" not in old.__qualname__
    return named and _qualname(old) == _qualname(new)
