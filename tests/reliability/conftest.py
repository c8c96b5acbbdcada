"""The trainer tests' tiny model and question file, shared with the reliability probes, and a trained
run to damage."""

import shutil

import pytest

from tests.reliability.runs import trained_run
from tests.train.conftest import qa_file, tiny_model_dir  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def base_run(tiny_model_dir, qa_file, tmp_path_factory):  # noqa: F811 (the fixtures above)
    """A 3-step trainer run (checkpoints 1, 2, 3), trained once per test module; (dir, its config)."""
    d = tmp_path_factory.mktemp("trained") / "run"
    return d, trained_run(d, tiny_model_dir, qa_file)


@pytest.fixture()
def run(base_run, tmp_path):
    """A copy of ``base_run`` to damage; returns (dir, its config pointed at the copy)."""
    d = tmp_path / "run"
    shutil.copytree(base_run[0], d)
    base_run[1].trainer.out_dir = str(d)
    return d, base_run[1]
