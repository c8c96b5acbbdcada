"""The trainer tests' tiny model and question file, shared with the reliability probes."""

from tests.train.conftest import qa_file, tiny_model_dir  # noqa: F401 (fixtures)
