"""The `mopd` command line: one console script, one subcommand per area.

Each area keeps its commands in its own ``commands`` module with a ``register(subparsers)``
function, and so does each recipe that brings commands (:func:`mopd.core.recipes.recipe_command_modules`);
they are imported only when the command line is built, so ``mopd --help`` stays fast
and an area's heavy imports (torch, transformers, faiss) happen only when its command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from mopd.core.recipes import failed_recipes, failure_note, recipe_command_modules

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mopd",
        description="MultiAgent-OPD: train a Leader/Searcher/Answerer team that shares one LLM "
                    "(Stage I outcome RL, Stage II on-policy distillation), evaluate it, and run its kernels.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for name in recipe_command_modules():   # the recipes that loaded (one that failed was one warning line)
        try:
            importlib.import_module(name).register(sub)
        except Exception as e:   # a recipe's broken commands cost its commands, not the command line
            print(f"mopd: warning: {name} failed to load and is skipped: {type(e).__name__}: {e}", file=sys.stderr)
    return parser


def _unknown_command(parser: argparse.ArgumentParser, argv: List[str]) -> Optional[str]:
    """One line for a command that no loaded module offers while a recipe failed to load (it may
    have offered it); None when argparse's own message will do."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or not failed_recipes():
        return None
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if words[0] in sub.choices:
        return None
    return f"mopd: error: unknown command {words[0]!r}{failure_note()}"


def _version() -> str:
    from mopd import __version__

    return __version__


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    unknown = _unknown_command(parser, sys.argv[1:] if argv is None else argv)
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
    (``mopd.train.distributed.end_process``)."""
    code = main()
    if "mopd.train.distributed" in sys.modules:   # only a training command can have joined a group
        from mopd.train.distributed import end_process

        end_process(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
