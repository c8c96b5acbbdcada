"""`mopd train` on SmolLM2-135M-Instruct: a Stage I step (cmas_rl, exported) and a Stage II step
(mopd, H-MAS) whose teacher is the same model, on the engine of ``MOPD_REAL_ENGINE`` (vLLM: with
its weight sync after the update). The paper's presets, not the tiny ones (their learning rates
are the 0.7M model's), shrunk to one question, two trajectories and short turns."""

import json
import math

import pytest

from mopd.cli import main
from tests.helpers.chat_templates import TEMPLATES
from tests.real.support import LIMITS, MAX_INPUT, MAX_OUTPUT, engine_overrides, require_real, template_overrides

require_real()
pytestmark = pytest.mark.real

STAGE2_TEMPLATE = "qwen3_hybrid"
"""Stage II trains under a Qwen3 template with enable_thinking=false: the template kwargs reach
the rollouts' renderings in training too."""


def train_overrides(model, world, out_dir, workflow):
    return [f"model.path={model}", f"data.train={world.train}", "data.dev=", f"trainer.out_dir={out_dir}",
            "trainer.steps=1", "trainer.questions_per_step=1", "trainer.ppo_minibatches=1",
            "trainer.micro_batch_tokens=4096", "trainer.val_every=0", "trainer.checkpoint_every=0",
            "rollout.group_size=2", "rollout.answer_candidates=1", f"rollout.max_output_tokens={MAX_OUTPUT}",
            f"rollout.max_input_tokens={MAX_INPUT}", f"retriever.index={world.index}", *LIMITS[workflow],
            *engine_overrides(training=True)]


def step_row(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/em" in r]
    assert [r["step"] for r in steps] == [1]
    row = steps[0]
    for k, v in row.items():
        assert not isinstance(v, str) or k == "time", (k, v)   # non-finite values are logged as strings
    return row


def check_step(row, printed):
    assert math.isfinite(row["loss/total"]) and row["perf/train_tokens_per_s"] > 0
    # pi_old is recomputed by the trainer; the engine's sampling log-probs of the same tokens must
    # agree (float32 on CPU): a token the engine saw differently from the trainer would not
    assert row["rollout_logprob_gap"] < 1e-3, row["rollout_logprob_gap"]   # measured: 1e-5 on both engines
    if row["rollout/invalid_call_frac"] == 1.0:   # zero-shot SmolLM2 often writes no valid action
        assert "no learning signal" in printed, printed


def test_stage1_step_trains_and_exports(real_model, quick_world, tmp_path, capsys):
    export = tmp_path / "export"
    args = ["train", "--steps", "1", "--export", str(export), "cmas_rl",
            *train_overrides(real_model, quick_world, tmp_path / "run", "cmas")]
    assert main(args) == 0
    row = step_row(tmp_path / "run")
    check_step(row, "".join(capsys.readouterr()))
    assert row["rollout/tokens_per_s/searcher"] > 0 and row["rollout/tokens_per_s/answerer"] > 0
    assert (export / "config.json").is_file() and (export / "model.safetensors").is_file()
    assert json.loads((export / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_stage2_step_with_the_same_model_as_teacher(template_models, quick_world, tmp_path, capsys):
    model = template_models[STAGE2_TEMPLATE]
    args = ["train", "--steps", "1", "mopd", *train_overrides(model, quick_world, tmp_path / "run", "hmas"),
            f"teacher.path={model}", *template_overrides(TEMPLATES[STAGE2_TEMPLATE][1])]
    assert main(args) == 0
    row = step_row(tmp_path / "run")
    check_step(row, "".join(capsys.readouterr()))
    assert row["rollout/tokens_per_s/leader"] > 0 and row["perf/score_s"] > 0   # the teacher's pass ran
    if "loss/searcher_opd_log_ratio" in row:   # Searchers ran (the Leader wrote a valid subtask)
        # the teacher is the policy itself: its log-probs of every Searcher token are the policy's
        assert abs(row["loss/searcher_opd_log_ratio"]) < 1e-3, row["loss/searcher_opd_log_ratio"]
