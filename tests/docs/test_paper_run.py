"""docs/gpu_training.md's step-by-step block on the tiny run: the plan, the retriever served (the
bundled corpus's index in wiki-18's place, on the CPU) and queried as mopd/retriever/README.md says,
the pipeline's dry run and the pipeline itself through its subprocess commands, run again to reuse
what is done; mopd/eval/README.md's evaluation and report of its exports; then "Your own model"'s
first check against the served retriever."""

from __future__ import annotations

import json

import pytest

from tests.docs.runner import DocShell
from tests.docs.sequences import sequence

pytestmark = pytest.mark.slow


def test_the_papers_run_step_by_step_then_a_models_first_check(tiny_assets, tmp_path):
    shell = DocShell(tmp_path / "work", tiny_assets)
    try:
        outputs = []
        for cmd in sequence("paper"):
            outputs.append((cmd, shell.run(cmd)))
            if cmd.text.startswith("mopd retriever serve"):
                assert json.loads(shell.get("/health"))["status"] == "ok"
                answer = json.loads(shell.get("/retrieve", {"queries": ["who wrote the iliad", "capital of peru"],
                                                           "topk": 3, "return_scores": True}))
                assert [len(r) for r in answer["result"]] == [3, 3]
                assert all(set(hit) == {"document", "score"} for r in answer["result"] for hit in r)
        texts = [c.text for c, _ in outputs]
        assert texts.count("mopd pipeline paper") == 1 and "mopd pipeline paper --dry-run" in texts
        paper = shell.cwd / "runs" / "paper"
        assert (paper / "report" / "report.md").exists()
        for system in ("c_mas_base", "c_mas_plus_rl", "h_mas_base", "prompted_critic", "multiagent_opd"):
            assert (paper / "eval" / system / "records.jsonl").read_text().strip(), system
        # the doc's "run again": every stage reused, nothing rebuilt
        stamp = (paper / "stage2" / "export" / "config.json").stat().st_mtime_ns
        (again,) = [c for c, _ in outputs if c.text == "mopd pipeline paper"]
        shell.run(again)
        assert (paper / "stage2" / "export" / "config.json").stat().st_mtime_ns == stamp
        # mopd/eval/README.md on the pipeline's exports
        assert (shell.cwd / "evals" / "report" / "report.md").exists()
        assert len((shell.cwd / "evals" / "mopd" / "records.jsonl").read_text().splitlines()) == 4 * 9
        check = dict(outputs)[next(c for c, _ in outputs if c.text.startswith("mopd eval run --model /models"))]
        assert "format validity: leader" in check
        assert (shell.cwd / "runs" / "check" / "records.jsonl").exists()
    finally:
        shell.stop_servers()
