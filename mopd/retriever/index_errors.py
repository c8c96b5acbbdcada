"""The errors of index directories, shared by the index store and every index backend."""


class IndexDirError(ValueError):
    """A missing or unreadable index directory, or a bad index kind."""


class IndexMismatch(ValueError):
    """An index used with a query encoder or a corpus other than the ones it was built from."""
