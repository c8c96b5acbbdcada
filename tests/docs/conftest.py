"""The files the docs' commands find on a user's machine, made tiny: the Hub model (a random Qwen3
model in a private Hugging Face cache, under the docs' model id), a QA file, and the paper pipeline's
settings for a tiny run (the bundled corpus's index, for wiki-18's, is linked in on first use)."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from tests.docs.runner import HUB_MODEL, TINY_RUN, DocShell

SNAPSHOT = "d0c5" * 10


def tiny_paper_yaml(assets) -> str:
    """`mopd pipeline paper --file` settings: the paper's stages on the tiny run (one process each)."""
    qa = str(assets / "qa.jsonl")
    run = [o for o in TINY_RUN.split() if not o.startswith(("data.", "retriever.", "trainer.steps="))]
    stage = {"steps": 2, "overrides": run}
    cfg = {"data": {"train": qa, "dev": qa, "test": qa},
           "retriever": {"kind": "inprocess", "index": "bundled"},
           "stage1": stage, "stage2": {"mopd": stage, "prompted_critic": stage},
           "eval": {"attempts": 1, "questions": 2, "overrides": ["rollout.engine=hf", "rollout.max_output_tokens=8",
                                                                  "rollout.max_steps=2", "rollout.max_rounds=1"]},
           "teacher_check": {"questions": 2}, "report": {"draws": 20},
           "launcher": {"gpus": 1, "train": "torchrun --nproc_per_node 1 -m mopd",
                        "eval": "torchrun --nproc_per_node 1 -m mopd", "arm_workers": 1, "eval_workers": 1}}
    return json.dumps(cfg, indent=1)   # JSON is YAML


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    from tests.helpers.tiny_model import init_tiny_model

    assets = tmp_path_factory.mktemp("doc_assets")
    model = init_tiny_model(assets / "models" / "tiny", vocab_size=400, hidden=32, layers=1, heads=2, ffn=64, seed=7)
    repo = assets / "hub" / ("models--" + HUB_MODEL.replace("/", "--"))
    shutil.copytree(model, repo / "snapshots" / SNAPSHOT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SNAPSHOT)
    rng = random.Random(58)
    rows = [{"id": f"q{i}", "question": f"Which town was band {rng.randrange(1000)} formed in?",
             "golden_answers": [f"town {rng.randrange(5)}"]} for i in range(9)]
    (assets / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (assets / "tiny_paper.yaml").write_text(tiny_paper_yaml(assets))
    return assets


@pytest.fixture
def doc_shell(tmp_path, tiny_assets):
    """A fresh working directory for one sequence of documented commands."""
    shell = DocShell(tmp_path / "work", tiny_assets)
    yield shell
    shell.stop_servers()
