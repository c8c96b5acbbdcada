"""The OPD teacher and the KL reference: which model each role's signal comes from, loaded once."""

import pytest
import torch

from mopd.config import ConfigError, resolve


@pytest.fixture(scope="module")
def stage1_dir(tmp_path_factory):
    """A second tiny model with the same tokenizer and other weights (stands in for the Stage-I export)."""
    from tests.helpers.tiny_model import init_tiny_model

    out = tmp_path_factory.mktemp("stage1")
    return str(init_tiny_model(out, vocab_size=400, hidden=32, layers=1, heads=2, ffn=64, seed=1))


def _cfg(preset, **over):
    return resolve(preset, [f"{k}={v}" for k, v in over.items()])


def _batch():
    from mopd.train.packing import build_packed_batch

    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(5, 300, (n,), generator=g).tolist() for n in (7, 4, 11)]
    z = [[0.0] * len(s) for s in seqs]
    return build_packed_batch(seqs, [[0] * len(s) for s in seqs], z, z)


def _load(cfg, model_dir):
    from transformers import AutoTokenizer

    from mopd.train.teacher import load_frozen_models

    tok = AutoTokenizer.from_pretrained(model_dir)
    return load_frozen_models(cfg, student_tokenizer=tok, device=torch.device("cpu"))


def _direct(path):
    from transformers import AutoTokenizer

    from mopd.train.teacher import Teacher

    return Teacher(path, student_tokenizer=AutoTokenizer.from_pretrained(path), device=torch.device("cpu"))


def test_base_teacher_scores_opd_with_pi0_and_keeps_the_stage1_reference(tiny_model_dir, stage1_dir, qa_file):
    cfg = _cfg("base_teacher", **{"model.path": tiny_model_dir, "data.train": qa_file,
                                  "teacher.path": tiny_model_dir, "reference.path": stage1_dir})
    cfg.check_trainable()
    assert (cfg.opd_roles(), cfg.reference_roles()) == (["searcher"], ["answerer", "leader"])
    frozen = _load(cfg, tiny_model_dir)
    b = _batch()
    teacher, reference = frozen.teacher.logprobs(b), frozen.reference.logprobs(b)
    assert torch.allclose(teacher, _direct(tiny_model_dir).logprobs(b))
    assert torch.allclose(reference, _direct(stage1_dir).logprobs(b))
    assert not torch.allclose(teacher, reference)


def test_the_paper_presets_load_one_model_for_teacher_and_reference(tiny_model_dir, stage1_dir, qa_file):
    cfg = _cfg("mopd", **{"model.path": tiny_model_dir, "data.train": qa_file, "teacher.path": stage1_dir})
    assert cfg.reference_path() == stage1_dir
    frozen = _load(cfg, tiny_model_dir)
    assert frozen.teacher is frozen.reference and frozen.teacher.path == stage1_dir
    # no OPD role: only the reference; Stage I: neither
    cfg = _cfg("outcome_searcher", **{"model.path": tiny_model_dir, "data.train": qa_file,
                                      "teacher.path": stage1_dir})
    frozen = _load(cfg, tiny_model_dir)
    assert frozen.teacher is None and frozen.reference.path == stage1_dir
    assert _load(_cfg("cmas_rl"), tiny_model_dir) == (None, None)


def test_missing_frozen_models_are_named(tiny_model_dir, qa_file):
    base = {"model.path": tiny_model_dir, "data.train": qa_file}
    with pytest.raises(ConfigError, match=r"reference\.path=DIR \(the Stage-I export\)"):
        _cfg("base_teacher", **base, **{"teacher.path": tiny_model_dir}).check_trainable()
    with pytest.raises(ConfigError, match=r"\['searcher'\] learn by OPD.*teacher\.path"):
        _cfg("base_teacher", **base, **{"reference.path": tiny_model_dir}).check_trainable()
    with pytest.raises(ConfigError, match="teacher.path=DIR or reference.path=DIR"):
        _cfg("outcome_searcher", **base).check_trainable()
    _cfg("outcome_searcher", **base, **{"reference.path": tiny_model_dir}).check_trainable()
    # a KL loss term on a role needs the reference too
    with pytest.raises(ConfigError, match=r"\['searcher'\] need KL-reference"):
        _cfg("cmas_rl", **base, **{"algo.searcher.kl_coef": 0.1}).check_trainable()


def test_preflight_and_run_identity_know_the_reference(tiny_model_dir, stage1_dir, qa_file, tmp_path):
    from mopd.train.preflight import PreflightError, check_training_inputs
    from mopd.train.run_dir import identity_differences, run_identity

    base = {"model.path": tiny_model_dir, "data.train": qa_file, "retriever.index": "bundled",
            "trainer.questions_per_step": 8}   # the test file's 8 questions: a step deals each at most twice
    check_training_inputs(_cfg("outcome_searcher", **base, **{"reference.path": stage1_dir}))
    with pytest.raises(PreflightError, match="reference.path=.*does not exist"):
        check_training_inputs(_cfg("base_teacher", **base, **{"teacher.path": tiny_model_dir,
                                                               "reference.path": str(tmp_path / "nowhere")}))
    a = run_identity(_cfg("base_teacher", **base, **{"teacher.path": tiny_model_dir, "reference.path": stage1_dir}))
    b = run_identity(_cfg("base_teacher", **base, **{"teacher.path": tiny_model_dir,
                                                     "reference.path": tiny_model_dir}))
    refused, _ = identity_differences(a, b)
    assert {"reference.path", "reference.resolved_path", "reference.weights"} <= set(refused)


def _trainer(preset, model_dir, qa_file, out, **extra):
    from mopd.train.trainer import PolicyTrainer
    from tests.helpers.retrievers import FakeRetriever
    from tests.helpers.training import tiny_overrides

    return PolicyTrainer(resolve(preset, tiny_overrides(model_dir, qa_file, out, **extra)), retriever=FakeRetriever(),
                         progress=False)


def test_base_teacher_training_takes_kl_from_stage1_and_opd_from_pi0(tiny_model_dir, stage1_dir, qa_file, tmp_path):
    from mopd.core.roles import role_id
    from mopd.rollout.run_state import WorkflowSettings

    t = _trainer("base_teacher", tiny_model_dir, qa_file, tmp_path / "run", **{
        "teacher.path": tiny_model_dir, "reference.path": stage1_dir, "rollout.max_steps": 4})
    assert (t.frozen.teacher.path, t.frozen.reference.path) == (tiny_model_dir, stage1_dir)
    records = t.rollout(t.sampler.take(t.train_questions), WorkflowSettings.for_training(t.cfg, 0), attempts=2)
    step = t.score(records)
    temp = t.cfg.rollout.temperature
    stage1, pi0 = _direct(stage1_dir), _direct(tiny_model_dir)
    kl_roles = torch.tensor([role_id("leader"), role_id("answerer")])
    checked = 0
    for b in step.batches:
        kl_pos = torch.isin(b.roles, kl_roles)
        assert torch.allclose(b.ref_logp[kl_pos], stage1.logprobs(b, temp)[kl_pos], atol=1e-5)
        assert not torch.allclose(b.ref_logp[kl_pos], pi0.logprobs(b, temp)[kl_pos], atol=1e-3)
        opd_pos = b.roles == role_id("searcher")
        assert torch.allclose(b.teacher_logp[opd_pos], pi0.logprobs(b, temp)[opd_pos], atol=1e-5)
        checked += int(kl_pos.sum())
    assert checked > 0
    assert t.fit(1)["loss/skipped_updates"] == 0.0


def test_a_kl_loss_term_on_a_role_trains_towards_the_reference(tiny_model_dir, stage1_dir, qa_file, tmp_path):
    """algo.answerer.kl_coef > 0 loads the reference and its KL enters the loss (it used to crash at the
    first update, the loss getting no reference log-probs)."""
    import dataclasses

    from mopd.core.roles import role_id
    from mopd.rollout.run_state import WorkflowSettings
    from mopd.train.model import policy_loss_head

    t = _trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / "run",
                 **{"algo.answerer.kl_coef": 0.5, "reference.path": stage1_dir})
    assert t.frozen.teacher is None and t.frozen.reference.path == stage1_dir
    records = t.rollout(t.sampler.take(t.train_questions), WorkflowSettings.for_training(t.cfg, 0), attempts=2)
    # the micro-batch holding the most Answerer tokens (calls are spread over micro-batches by tokens)
    b = max(t.score(records).batches, key=lambda x: int((x.roles == role_id("answerer")).sum()))
    b.advantages = torch.zeros_like(b.old_logp)
    no_kl = dataclasses.replace(t.cfg.algo, roles={**t.cfg.algo.roles, "answerer": dataclasses.replace(t.cfg.algo.role("answerer"), kl_coef=0.0)})
    with torch.no_grad():
        with_term, stats = t.policy(b, t.loss, normalizer=1.0)
        without, _ = t.policy(b, policy_loss_head(dataclasses.replace(t.cfg, algo=no_kl)), normalizer=1.0)
    a = stats[role_id("answerer")]
    answerer_kl = float(a["kl"]) * float(a["tokens"])                   # its k3 sum over Answerer tokens
    assert answerer_kl > 0
    assert float(with_term - without) == pytest.approx(0.5 * answerer_kl, rel=1e-4)
    assert t.fit(1)["loss/skipped_updates"] == 0.0
