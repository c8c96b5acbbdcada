"""The trainer's own error: the run cannot go on, and what was kept is said in one line."""


class TrainingError(RuntimeError):
    """The run cannot go on (repeated non-finite updates, lost retriever, ...); a checkpoint was written."""
