"""A tiny pipeline for the tests: a random model of 32 hidden units, 8 questions, the bundled
corpus, two steps per stage; every stage runs in seconds."""

import pytest

from mopd.config import RetrieverConfig
from mopd.pipeline.config import (DataPaths, EvalSettings, LauncherConfig, PipelineConfig, ReportSettings,
                                  SystemConfig, TeacherCheckSettings, TrainStageConfig)
from tests.train import conftest as train_fixtures

qa_file, tiny_model_dir = train_fixtures.qa_file, train_fixtures.tiny_model_dir   # the trainer tests' fixtures

RUN = ["trainer.questions_per_step=2", "rollout.group_size=2", "rollout.answer_candidates=2",
       "rollout.max_output_tokens=8", "rollout.max_steps=2", "rollout.max_rounds=1", "trainer.micro_batch_tokens=600",
       "trainer.val_every=1", "trainer.val_attempts=1", "data.dev_size=2", "trainer.checkpoint_every=1",
       # a random model writes no valid action: its steps have no learning signal, which must not stop them
       "trainer.max_signalless_steps=0", "trainer.cpu_threads=1"]
"""Overrides of every tiny training stage."""


def tiny_pipeline(model_dir, qa, root, launcher: str = "inprocess") -> PipelineConfig:
    """Stage I (tiny_cmas_rl) and one Stage II arm (tiny_mopd), two steps each, then three systems
    evaluated on two questions and reported."""
    return PipelineConfig(
        name="tiny", root=str(root), model=str(model_dir), data=DataPaths(train=qa, dev=qa, test=qa),
        retriever=RetrieverConfig(kind="inprocess", index="bundled"),
        stage1=TrainStageConfig("C-MAS + RL", "tiny_cmas_rl", "stage1", steps=2, overrides=list(RUN)),
        stage2={"mopd": TrainStageConfig("MultiAgent-OPD", "tiny_mopd", "stage2", steps=2, overrides=list(RUN),
                                         export="last")},
        systems=[SystemConfig("C-MAS base", "base", "cmas"), SystemConfig("C-MAS + RL", "stage1", "cmas"),
                 SystemConfig("MultiAgent-OPD", "mopd", "hmas")],
        eval=EvalSettings(attempts=1, questions=2), teacher_check=TeacherCheckSettings(questions=3),
        report=ReportSettings(kind="eval", draws=20),
        launcher=LauncherConfig(kind=launcher, arm_workers=1, eval_workers=1))


@pytest.fixture
def tiny(tiny_model_dir, qa_file, tmp_path):
    """The tiny pipeline under tmp_path/run."""
    return tiny_pipeline(tiny_model_dir, qa_file, tmp_path / "run")
