"""Stage II's on-policy distillation on real Searcher tokens. Zero-shot SmolLM2 never writes a valid
subtask, so its own H-MAS rollouts never reach a Searcher (tests/real/test_train.py); here a
scripted team writes the texts (tokenised by the real tokenizer, under the real template), and the
trainer does the rest with the real model: pi_old, the teacher's log-probs of every Searcher
token, the OPD advantage beta * (teacher - pi_old), the fused loss and the update. HF pass only
(the rollout is scripted, so no engine samples)."""

import json

import pytest
import torch

from mopd.config import resolve
from mopd.rollout.async_scheduler import run_rollout
from mopd.rollout.scripted_engine import ScriptedEngine
from tests.helpers.prompts import role_of
from tests.real.support import engine, require_real

require_real()
pytestmark = [pytest.mark.real,
              pytest.mark.skipif(engine() != "hf", reason="the rollout is scripted: the HF pass covers it")]


def _respond(prompt, params):
    role = role_of(prompt)
    if role == "leader":
        if "Report 1 (task:" in prompt:
            return "<select>1,2</select>"
        return "<subtask>Where was the first band formed?</subtask><subtask>Where was the second band formed?</subtask>"
    if role == "searcher":
        if "Doc 1(Title:" in prompt:
            return "<report>The band was formed in Norwick, by the river Lune.</report>"
        return "<search>band formed town</search>"
    return "<answer>Norwick</answer>"


def _scripted_rollout(engine, retriever, tokenizer, questions, settings, *, attempts, method="", progress=True):
    return run_rollout(ScriptedEngine(tokenizer, _respond, record_batches=False), retriever, tokenizer, questions,
                       settings, attempts=attempts, method=method, progress=False)


@pytest.fixture(scope="module")
def other_teacher(real_model, tmp_path_factory):
    """The real model with noise on its last layer's MLP: a teacher whose log-probs differ."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("teacher") / "model"
    model = AutoModelForCausalLM.from_pretrained(real_model, dtype=torch.float32)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        w = model.model.layers[-1].mlp.down_proj.weight
        w.add_(0.05 * w.std() * torch.randn(w.shape, generator=g))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(real_model).save_pretrained(out)
    return out


def _stage2_step(model, teacher, world, run_dir):
    from mopd.train.trainer import PolicyTrainer

    cfg = resolve("mopd", [
        f"model.path={model}", f"teacher.path={teacher}", f"data.train={world.train}", "data.dev=",
        f"trainer.out_dir={run_dir}", "trainer.steps=1", "trainer.questions_per_step=1", "trainer.ppo_minibatches=1",
        "trainer.micro_batch_tokens=8192", "trainer.val_every=0", "trainer.checkpoint_every=0",
        "rollout.group_size=2", "rollout.answer_candidates=1", "rollout.max_steps=6", "rollout.max_rounds=1",
        "rollout.max_input_tokens=2048", "rollout.max_output_tokens=48", f"retriever.index={world.index}",
        "rollout.engine=hf", "trainer.old_logprobs=recompute"])
    before = None
    trainer = PolicyTrainer(cfg, rollout_fn=_scripted_rollout, progress=False)
    try:
        before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        trainer.fit()
        moved = sum(float((v - before[k]).abs().sum()) for k, v in trainer.model.state_dict().items())
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if "rollout/em" in r]
    return row, moved


def test_opd_scores_every_real_searcher_token_against_the_teacher(real_model, other_teacher, quick_world, tmp_path):
    same, _ = _stage2_step(real_model, real_model, quick_world, tmp_path / "same")
    # Searchers ran in every workflow (two per Leader wave), and none of their outputs was invalid
    assert same["rollout/invalid_call_frac"] == 0.0 and same["rollout/tokens_per_s/searcher"] > 0
    # the teacher is the policy itself: its log-prob of every Searcher token is pi_old's
    assert abs(same["loss/searcher_opd_log_ratio"]) < 1e-4, same["loss/searcher_opd_log_ratio"]
    other, moved = _stage2_step(real_model, other_teacher, quick_world, tmp_path / "other")
    # another teacher: a real OPD signal on real Searcher tokens, and the update moved the weights
    assert abs(other["loss/searcher_opd_log_ratio"]) > 1e-3, other["loss/searcher_opd_log_ratio"]
    assert abs(other["loss/searcher_opd_log_ratio"]) < 5.0
    assert moved > 0
