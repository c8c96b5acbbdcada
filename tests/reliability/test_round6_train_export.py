"""`mopd train --export` says which checkpoint it exported and why: one line naming the step and the
reason (the best validation, or the last weights), not a silent step 1 of a 2-step run."""

import json
import re

import pytest

from mopd.cli import main
from tests.reliability.indexes import bm25_index


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from tests.helpers.tiny_model import init_tiny_model

    root = tmp_path_factory.mktemp("train_export")
    model = init_tiny_model(root / "base", vocab_size=300, hidden=32, layers=1, heads=2, ffn=48, seed=3)
    qa = root / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Where was band {i} formed?",
                                      "golden_answers": [f"town {i % 3}"]}) + "\n" for i in range(5)))
    dev = root / "dev.jsonl"
    dev.write_text("".join(json.dumps({"id": f"d{i}", "question": f"Which river runs by band {i}?",
                                       "golden_answers": [f"river {i % 7}"]}) + "\n" for i in range(3)))
    return {"model": model, "qa": qa, "dev": dev, "index": bm25_index(root / "retrieval", n=7)}


def _train(w, out, export, *extra):
    return main(["train", "--export", str(export), *extra, "cmas_rl", f"model.path={w['model']}",
                 f"data.train={w['qa']}", f"data.dev={w['dev']}", "data.dev_size=3", f"trainer.out_dir={out}",
                 "retriever.kind=inprocess", f"retriever.index={w['index']}", "trainer.steps=2",
                 "trainer.questions_per_step=1", "rollout.group_size=2", "rollout.answer_candidates=2",
                 "rollout.max_output_tokens=5", "rollout.max_steps=2", "trainer.max_signalless_steps=0",
                 "trainer.checkpoint_every=1", "trainer.val_every=1", "trainer.micro_batch_tokens=600"])


def _export_lines(err: str) -> list:
    return [line for line in err.splitlines() if line.startswith("mopd: exporting step")]


@pytest.mark.slow   # two 2-step training runs of a tiny model with validation: ~20 s on a loaded machine
def test_train_export_names_the_step_it_exports_and_why(world, tmp_path, capsys):
    assert _train(world, tmp_path / "run", tmp_path / "best") == 0
    err = capsys.readouterr().err
    best = json.loads((tmp_path / "run" / "checkpoints" / "best.json").read_text())
    (line,) = _export_lines(err)
    # the random model's val/em ties at every validation: the first one stays the best
    assert re.fullmatch(rf"mopd: exporting step {best['step']} to {re.escape(str(tmp_path / 'best'))}: the best "
                        rf"validation \(val/em {best['value']:.4f}; (the run ended at step 2|also the last step)\)",
                        line), line
    marker = json.loads((tmp_path / "best" / "mopd_export.json").read_text())
    assert marker["step"] == best["step"]
    assert _train(world, tmp_path / "run2", tmp_path / "last", "--export-checkpoint", "last") == 0
    (line,) = _export_lines(capsys.readouterr().err)
    assert line == (f"mopd: exporting step 2 to {tmp_path / 'last'}: the last weights (step 2 of the run; "
                    "--export-checkpoint last)")
