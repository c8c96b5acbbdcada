"""Command-line arguments shared by every ``mopd`` command that takes a preset."""

from __future__ import annotations

import argparse


def add_overrides_argument(parser: argparse.ArgumentParser) -> None:
    """Everything after the preset is a config override (``a.b=1`` or ``--a.b 1``); a command's own
    options therefore go before the preset."""
    parser.add_argument("overrides", nargs=argparse.REMAINDER,
                        help="config overrides after the preset: trainer.lr=2e-6 or --trainer.lr 2e-6")
