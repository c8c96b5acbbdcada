"""Finding recipes (:mod:`mopd.recipes`) without naming them: one loader that every caller shares.

A recipe registers its presets, stage kinds, report kinds, engines, rewards and commands when it is
imported. The core never imports one by name; :func:`load_recipes` imports every package under
``mopd/recipes/`` and every module declared under the ``mopd.recipes`` entry-point group (a recipe
in another distribution), once per process. A :class:`mopd.core.registry.Registry` calls it before
it is listed, and before it answers that it lacks a name (a name it holds is the same with or
without the recipes: a recipe cannot take a registered name); the command line calls it only for a
command that no core module offers (:func:`recipe_command_modules`), so ``python -c`` and ``mopd``
see the same names and the core's commands never wait on a recipe.

A recipe is a plug-in, and one bad plug-in never takes the tool down:

- a recipe that fails to import, with any exception (``SystemExit`` and a ``KeyboardInterrupt`` it
  raises itself included), costs one warning line on stderr naming it and its error, and what it
  registered before it failed is taken out again (a recipe loads whole or not at all); a Ctrl-C of
  the user's during the import still interrupts the command;
- a recipe whose import takes longer than :func:`import_bound` seconds (``MOPD_RECIPE_IMPORT_TIMEOUT``,
  default 60; 0 means no bound) is stopped there and skipped the same way: a SIGALRM timer in the
  main thread raises inside its import (on a platform without ``setitimer``, or when the recipes
  are loaded from another thread, there is no bound);
- what a recipe prints while it is imported goes to stderr (``sys.stdout`` and file descriptor 1
  both), so output that a program reads (``--json``, YAML, a pipe) holds only its data.

A registry that is asked for a name it does not hold names the recipes that failed
(:func:`failure_note`), since one of them may have provided it. Two recipes registering one name:
the second fails to load, with the registry's one-line refusal naming both.

``mopd --help`` lists the recipes' commands without importing them (:func:`declared_commands`
reads each recipe's ``commands.py`` as text).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import os
import pkgutil
import signal
import sys
import threading
import time
from importlib.metadata import entry_points
from typing import Callable, Dict, List, Optional, Tuple

PACKAGE = "mopd.recipes"
"""Where the bundled recipes live."""
ENTRY_POINT_GROUP = "mopd.recipes"
"""The entry-point group under which other distributions declare their recipe modules."""
IMPORT_BOUND_ENV = "MOPD_RECIPE_IMPORT_TIMEOUT"
"""Seconds one recipe's import may take before it is skipped (0: no bound)."""
DEFAULT_IMPORT_BOUND_S = 60.0

_loaded: List[str] = []
_failed: Dict[str, str] = {}
_state = {"done": False, "loading": False}
_undo: List[List[Callable[[], None]]] = []   # one list per recipe being imported (the innermost last)
_warned_bounds: set = set()


def recipe_names() -> List[str]:
    """Module names of every recipe: the bundled packages, then the entry points' modules."""
    folders = importlib.import_module(PACKAGE).__path__   # the package's folders (a test may add one)
    bundled = [f"{PACKAGE}.{m.name}" for m in pkgutil.iter_modules(folders) if m.ispkg]
    declared = [ep.value.split(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return list(dict.fromkeys(bundled + declared))


def import_bound() -> float:
    """Seconds one recipe's import may take: ``MOPD_RECIPE_IMPORT_TIMEOUT`` (0: no bound), else 60."""
    text = os.environ.get(IMPORT_BOUND_ENV, "").strip()
    try:
        value = float(text) if text else DEFAULT_IMPORT_BOUND_S
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        if text not in _warned_bounds:   # once per process, however often it is read
            _warned_bounds.add(text)
            print(f"mopd: warning: {IMPORT_BOUND_ENV}={text!r} is not a number of seconds >= 0; "
                  f"using {DEFAULT_IMPORT_BOUND_S:g}", file=sys.stderr)
        value = DEFAULT_IMPORT_BOUND_S
    return value


def load_recipes() -> List[str]:
    """Import every recipe (once per process), so each registers what it brings; returns the module
    names of those that loaded. A recipe that fails, or takes longer than :func:`import_bound`, is
    reported in one warning line and skipped. A call made while the recipes are being imported (a
    recipe reading a registry) returns at once."""
    if _state["done"] or _state["loading"]:
        return list(_loaded)
    _state["loading"] = True
    try:
        bound = import_bound()
        for name in recipe_names():
            _import_whole(name, bound)
    finally:
        _state["loading"] = False
        _state["done"] = True
    return list(_loaded)


class _TookTooLong(BaseException):
    """Raised inside a recipe's import by the timer (a BaseException: a recipe's ``except
    Exception`` around what blocks does not swallow it)."""


def _import_whole(name: str, bound: float) -> None:
    _undo.append([])
    try:
        error = _attempt(lambda: importlib.import_module(name), bound)
        if error is None:
            _loaded.append(name)
            return
        for undo in reversed(_undo[-1]):
            undo()
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
        _failed[name] = _one_line(error)
        print(f"mopd: warning: recipe {name} failed to load and is skipped: {_failed[name]}", file=sys.stderr)
    finally:
        _undo.pop()


def run_plugin_code(what: str, fn: Callable[[], object]) -> bool:
    """Run ``fn`` (a recipe's code: importing its ``commands`` module, its ``register``) as a
    recipe's import runs: within :func:`import_bound`, its prints on stderr; whatever it raises is
    one warning line naming ``what`` and False (the user's Ctrl-C still interrupts)."""
    error = _attempt(fn, import_bound())
    if error is not None:
        print(f"mopd: warning: {what} failed to load and is skipped: {_one_line(error)}", file=sys.stderr)
    return error is None


def _attempt(fn: Callable[[], object], bound: float) -> Optional[BaseException]:
    """``fn()`` under :class:`_Guard` with stdout on stderr; what it raised (None if nothing), unless
    it was the user's Ctrl-C, which goes on up."""
    guard = _Guard(bound)
    try:
        with _stdout_to_stderr(), guard:   # the timer is off before stdout is restored
            fn()
    except BaseException as e:   # any failure of a plug-in: the core and the other recipes go on without it
        if guard.interrupted:   # the user's Ctrl-C, not the recipe's doing: the command stops
            raise
        return e
    return None


class _Guard:
    """While a recipe is imported in the main thread: a SIGALRM timer that raises
    :class:`_TookTooLong` after ``bound`` seconds, and a SIGINT handler that notes a real Ctrl-C
    (so that the loader tells it from a ``KeyboardInterrupt`` the recipe raised) before passing it
    on. Both are restored afterwards, an earlier timer with what was left of it."""

    def __init__(self, bound: float):
        self.bound = bound
        self.interrupted = False
        self.disarmed = False
        self._saved: Optional[tuple] = None

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        old_int = signal.getsignal(signal.SIGINT)
        if callable(old_int):
            def on_int(signum, frame):
                self.interrupted = True
                old_int(signum, frame)

            signal.signal(signal.SIGINT, on_int)
        timed = self.bound > 0 and hasattr(signal, "setitimer")
        old_alarm = old_timer = None
        if timed:
            def on_alarm(signum, frame):
                if not self.disarmed:
                    raise _TookTooLong(f"its import took longer than {self.bound:g} s (the bound that "
                                       f"{IMPORT_BOUND_ENV} sets; 0: none)")

            old_alarm = signal.signal(signal.SIGALRM, on_alarm)
            old_timer = signal.setitimer(signal.ITIMER_REAL, self.bound)
        self._saved = (old_int if callable(old_int) else None, timed, old_alarm, old_timer, time.monotonic())
        return self

    def __exit__(self, *exc):
        if self._saved is None:
            return False
        try:
            self.disarmed = True
        finally:   # even if the timer fired just now (it fires once): everything is restored
            self._restore()
        return False

    def _restore(self) -> None:
        old_int, timed, old_alarm, old_timer, start = self._saved
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_alarm if old_alarm is not None else signal.SIG_DFL)
            left, interval = old_timer
            if left > 0:   # someone else's timer (pytest-timeout's, say): what was left of it
                signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - start), 1e-3), interval)
        if old_int is not None:
            signal.signal(signal.SIGINT, old_int)


@contextlib.contextmanager
def _stdout_to_stderr():
    """``sys.stdout`` and, where it can be, file descriptor 1 point at stderr meanwhile (a recipe's
    prints, and a library's it imports, never reach output that a program reads)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved_fd = None
    with contextlib.suppress(OSError, ValueError):
        saved_fd = os.dup(1)
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if isinstance(e, _TookTooLong):
        return text
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


def recipe_of(module: str) -> Optional[str]:
    """The recipe that ``module`` belongs to (a loaded recipe's name, or the module itself for a
    module under ``mopd.recipes``), None for the core's own modules."""
    for name in _loaded + list(_failed):
        if module == name or module.startswith(name + "."):
            return name
    if module.startswith(PACKAGE + "."):
        return ".".join(module.split(".")[:3])
    return None


def recipe_command_modules() -> List[str]:
    """The ``commands`` modules of the recipes that loaded and have one (each with
    ``register(subparsers)``)."""
    out = []
    for name in load_recipes():
        if importlib.util.find_spec(f"{name}.commands") is not None:
            out.append(f"{name}.commands")
    return out


def declared_commands() -> List[Tuple[str, str]]:
    """``(command, help)`` of every recipe's commands, read from its ``commands.py`` without running
    any of the recipe's code (``mopd --help`` lists them and imports no recipe): the first argument
    of each ``add_parser("name", help="...")`` called on ``register``'s first parameter, in
    ``register`` itself or in a function of the module it passes that parameter to. A recipe whose
    commands are built otherwise is not listed there (its commands still run)."""
    out: List[Tuple[str, str]] = []
    for name in recipe_names():
        with contextlib.suppress(Exception):   # a recipe's file we cannot read lists nothing
            spec = _spec_without_running(f"{name}.commands")
            if spec is not None and spec.origin and spec.origin.endswith(".py"):
                with open(spec.origin, encoding="utf-8") as f:
                    out += _add_parser_calls(ast.parse(f.read()))
    return list(dict(out).items())


def _spec_without_running(module: str):
    """The import spec of ``module`` found through ``sys.meta_path``'s finders, parent by parent,
    running none of the packages on the way (``importlib.util.find_spec`` imports the parents)."""
    parts, path, spec = module.split("."), None, None
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(loaded, "__spec__", None) is not None:
            spec, path = loaded.__spec__, getattr(loaded, "__path__", None)
        else:
            spec = next((s for f in sys.meta_path if hasattr(f, "find_spec")
                         for s in [f.find_spec(name, path)] if s is not None), None)
            path = spec.submodule_search_locations if spec is not None else None
        if spec is None or (i < len(parts) and path is None):
            return None
    return spec


def _add_parser_calls(tree: ast.Module) -> List[Tuple[str, str]]:
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    out: List[Tuple[str, str]] = []

    def visit(fn: ast.FunctionDef, param_index: int, seen: set) -> None:
        params = fn.args.posonlyargs + fn.args.args
        if fn.name in seen or param_index >= len(params):
            return
        seen.add(fn.name)
        param = params[param_index].arg
        calls = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
        for call in calls:
            f = call.func
            if (isinstance(f, ast.Attribute) and f.attr == "add_parser" and isinstance(f.value, ast.Name)
                    and f.value.id == param and call.args and _text(call.args[0]) is not None):
                helps = [_text(k.value) for k in call.keywords if k.arg == "help"]
                out.append((_text(call.args[0]), (helps or [None])[0] or ""))
            elif isinstance(f, ast.Name) and f.id in functions:
                for i, arg in enumerate(call.args):
                    if isinstance(arg, ast.Name) and arg.id == param:
                        visit(functions[f.id], i, seen)

    if "register" in functions:
        visit(functions["register"], 0, set())
    return out


def _text(node) -> Optional[str]:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
