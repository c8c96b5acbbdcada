"""The errors of index directories, shared by the index store and every index backend.

Both are :class:`mopd.core.errors.UserError`: wherever an index is opened (``mopd train``, ``eval``,
``retriever serve``, ``search``), a damaged or mismatched one is one line, not a traceback."""

from mopd.core.errors import UserError


class IndexDirError(UserError, ValueError):
    """A missing, unreadable or damaged index directory, or a bad index kind."""


class IndexMismatch(UserError, ValueError):
    """An index used with a query encoder or a corpus other than the ones it was built from."""
