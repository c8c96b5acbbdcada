"""The error type of the command line: user mistakes, printed as one line without a traceback."""

from __future__ import annotations


class UserError(Exception):
    """An error caused by the user's input: printed as one clear line, without a traceback."""


class Interrupted(KeyboardInterrupt):
    """A command stopped by Ctrl-C or SIGTERM; its message says what was kept (the command line
    prints it after "interrupted", as one line)."""
