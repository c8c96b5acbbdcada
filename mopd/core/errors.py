"""The error type of the command line: user mistakes, printed as one line without a traceback."""

from __future__ import annotations


class UserError(Exception):
    """An error caused by the user's input: printed as one clear line, without a traceback."""
