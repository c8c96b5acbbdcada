"""The `mopd` command line: one console script, one subcommand per area.

Each area keeps its commands in its own ``commands`` module with a ``register(subparsers)``
function, and so does each recipe that brings commands (:func:`mopd.core.recipes.recipe_command_modules`);
they are imported only when the command line is built, so ``mopd --help`` stays fast
and an area's heavy imports (torch, transformers, faiss) happen only when its command runs.

The recipes are imported only for a command that no core module offers (``mopd demo``): ``mopd
--version``, ``mopd --help`` and the core's commands run whatever a recipe does at import (a hang,
an exit, prints). ``--help`` lists the recipes' commands from their source
(:func:`mopd.core.recipes.declared_commands`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional

from mopd.core.recipes import (declared_commands, failed_recipes, failure_note, recipe_command_modules,
                               run_plugin_code)

# Areas whose commands the CLI offers, in --help order.
COMMAND_MODULES = [
    "mopd.commands",
    "mopd.pipeline.commands",
    "mopd.data.commands",
    "mopd.train.commands",
    "mopd.eval.commands",
    "mopd.view.commands",
    "mopd.retriever.commands",
    "mopd.rollout.commands",
]


def build_parser(argv: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """The command line for ``argv``: the core's commands, and the recipes' when ``argv`` names a
    command that the core does not offer, or when ``argv`` is None (every command). For ``--help``
    and the core's commands the recipes' commands are listed, not imported."""
    parser = argparse.ArgumentParser(
        prog="mopd",
        description="MultiAgent-OPD: train a Leader/Searcher/Answerer team that shares one LLM "
                    "(Stage I outcome RL, Stage II on-policy distillation), evaluate it, and run its kernels.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    word = None if argv is None else _command_word(argv)
    if argv is not None and (word is None or word in sub.choices):
        for command, text in declared_commands():   # listed for --help; `mopd COMMAND` imports its recipe
            if command not in sub.choices:
                sub.add_parser(command, help=text, add_help=False)
        return parser
    for name in recipe_command_modules():   # the recipes that loaded (one that failed was one warning line)
        _register_recipe_commands(name, sub)
    return parser


def _register_recipe_commands(name: str, sub) -> None:
    """Import a recipe's ``commands`` module and call its ``register(sub)`` as the recipe itself was
    imported (bounded, prints on stderr); whatever it raises costs its commands and one warning
    line, not the command line (what it added before it failed is taken out of the choices)."""
    before = set(sub.choices)
    if not run_plugin_code(name, lambda: importlib.import_module(name).register(sub)):
        added = [c for c in sub.choices if c not in before]
        for command in added:
            del sub.choices[command]
        sub._choices_actions[:] = [a for a in sub._choices_actions if a.dest not in added]   # --help's lines


def _command_word(argv: List[str]) -> Optional[str]:
    """The command that ``argv`` names (its first word that is not an option), None for none."""
    return next((a for a in argv if not a.startswith("-")), None)


def _unknown_command(parser: argparse.ArgumentParser, argv: List[str]) -> Optional[str]:
    """One line for a command that no loaded module offers while a recipe failed to load (it may
    have offered it); None when argparse's own message will do."""
    word = _command_word(argv)
    if word is None or not failed_recipes():
        return None
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if word in sub.choices:
        return None
    return f"mopd: error: unknown command {word!r}{failure_note()}"


def _version() -> str:
    from mopd import __version__

    return __version__


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(argv)   # may import the recipes: a Ctrl-C meanwhile is the user's
    except KeyboardInterrupt:
        print("mopd: interrupted", file=sys.stderr)
        return 130
    unknown = _unknown_command(parser, argv)
    if unknown:
        print(unknown, file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    if getattr(args, "pin_cpu", False) and "torch" not in sys.modules:
        # Before any handler imports torch: MKL and torch read these when they load
        # (mopd.core.reproducible says what each one pins). Once torch is loaded (main called
        # from a Python session) they would change nothing, so the environment is left alone.
        from mopd.core.reproducible import pin_cpu_environment

        pin_cpu_environment()
    from mopd.config import ConfigError
    from mopd.core.errors import UserError
    from mopd.core.qa import DataError
    from mopd.core.records import RecordError

    try:
        rc = args.func(args)
    except (UserError, ConfigError, RecordError, DataError, FileNotFoundError) as e:
        print(f"mopd {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        from mopd.core.errors import Interrupted

        detail = f": {e}" if isinstance(e, Interrupted) and str(e) else ""
        print(f"mopd {args.command}: interrupted{detail}", file=sys.stderr)
        return 130
    return int(rc or 0)


def run() -> None:
    """The ``mopd`` command: ``main``, then the exit that a torchrun worker needs
    (``mopd.train.distributed.end_process``). A reader that stops reading (``mopd config list |
    head -3``) ends the command quietly, as for any tool in a pipe."""
    try:
        code = main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # nothing more to flush at exit
        code = 141   # 128 + SIGPIPE, what a shell reports for a tool the pipe ended
    if "mopd.train.distributed" in sys.modules:   # only a training command can have joined a group
        from mopd.train.distributed import end_process

        end_process(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
