"""Command-line arguments shared by every ``mopd`` command that takes a preset."""

from __future__ import annotations

import argparse


class _Overrides(argparse.Action):
    """Collects the overrides; one of the command's own options among them (typed after the preset)
    ends the command with one line saying that options go before the preset."""

    def __call__(self, parser, namespace, values, option_string=None):
        for v in values:
            name = v.split("=", 1)[0]
            if name.startswith("-") and name in parser._option_string_actions:
                parser.exit(2, f"{parser.prog}: error: {name} comes after the preset or the overrides; "
                               f"options go before them: {parser.prog} {name} ... [PRESET] [overrides]\n")
        setattr(namespace, self.dest, values)


def add_overrides_argument(parser: argparse.ArgumentParser) -> None:
    """Everything after the preset is a config override (``a.b=1`` or ``--a.b 1``); a command's own
    options therefore go before the preset (one typed after it is refused with that message)."""
    parser.add_argument("overrides", nargs=argparse.REMAINDER, action=_Overrides,
                        help="config overrides after the preset: trainer.lr=2e-6 or --trainer.lr 2e-6")
