"""Steps without a learning signal are named and, after trainer.max_signalless_steps in a row, stop
the run with a checkpoint; validations say each role's format validity; the engine-vs-trainer
log-prob gap is a metric."""

import json
import re

import pytest
import torch

from mopd.config import ConfigError, resolve
from mopd.core.roles import role_of_prompt
from mopd_kernels.role_spec import RoleSpec
from mopd.rollout.scripted_engine import ScriptedEngine
from mopd.train.learning_signal import logprob_gap_sums, signal_token_counts
from mopd.train.packing import build_packed_batch
from mopd.train.trainer import PolicyTrainer, TrainingError
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.training import tiny_overrides

NO_SIGNAL = ("no learning signal: every trained token has advantage 0; "
             "invalid calls: searcher 1.00, answerer 1.00")


def invalid(prompt, params):
    """A policy that never writes an action of the grammar."""
    return "I am not sure what to do here"


def valid(prompt, params):
    """A policy in the grammar whose first Answerer candidate is right and second wrong (qa_file's
    band i was formed in town i % 3), so every Answerer group ranks something."""
    if role_of_prompt(prompt) == "answerer":
        i = int(re.search(r"band (\d+) formed", prompt).group(1))
        return [f"<answer>town {i % 3}</answer>", "<answer>nowhere</answer>"][:params.n]
    return "<report>the band was formed in a town</report>"


def trainer(model_dir, qa_file, out, respond, **extra):
    cfg = resolve("cmas_rl", tiny_overrides(model_dir, qa_file, out, **extra))
    t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)
    t.engine = ScriptedEngine(t.tokenizer, respond, record_batches=False)
    return t


def lines(err):
    return [x for x in err.splitlines() if "no learning signal" in x]


def test_invalid_policy_stops_after_exactly_n_steps_with_a_checkpoint(tiny_model_dir, qa_file, tmp_path, capsys):
    out = tmp_path / "run"
    t = trainer(tiny_model_dir, qa_file, out, invalid, **{"trainer.max_signalless_steps": 3, "trainer.steps": 6})
    with pytest.raises(TrainingError) as e:
        t.fit()
    assert t.step == 3
    message = str(e.value)
    assert message.startswith(f"step 3: {NO_SIGNAL}. Stopped after 3 such steps in a row") and "\n" not in message
    assert str(out / "checkpoints" / "step_000003") in message
    assert (out / "checkpoints" / "step_000003" / "trainer_state.json").is_file()
    state = json.loads((out / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
    assert state["signalless_steps"] == 3
    # steps 1 and 2 each said so in one line; step 3's line is the stop itself
    assert lines(capsys.readouterr().err) == [f"mopd: step 1: {NO_SIGNAL}", f"mopd: step 2: {NO_SIGNAL}"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["rollout/invalid_call_frac/searcher"] == 1.0 == rows[-1]["rollout/invalid_call_frac/answerer"]
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    assert [e["consecutive"] for e in events if e["kind"] == "no_signal"] == [1, 2, 3]


def test_the_count_is_of_steps_in_a_row(tiny_model_dir, qa_file, tmp_path, capsys):
    # invalid at steps 1 and 3, valid at step 2: never two in a row
    t = trainer(tiny_model_dir, qa_file, tmp_path / "run", lambda p, s: (valid if t.step == 1 else invalid)(p, s),
                **{"trainer.max_signalless_steps": 2, "trainer.steps": 3})
    t.fit()
    assert t.step == 3 and t.signalless_steps == 1
    assert lines(capsys.readouterr().err) == [f"mopd: step 1: {NO_SIGNAL}", f"mopd: step 3: {NO_SIGNAL}"]


def test_zero_disables_the_stop_but_not_the_line(tiny_model_dir, qa_file, tmp_path, capsys):
    t = trainer(tiny_model_dir, qa_file, tmp_path / "run", invalid, **{"trainer.steps": 3})
    assert t.cfg.trainer.max_signalless_steps == 0
    t.fit()
    assert t.step == 3
    assert len(lines(capsys.readouterr().err)) == 3


def test_a_run_that_learns_says_nothing(tiny_model_dir, qa_file, tmp_path, capsys):
    t = trainer(tiny_model_dir, qa_file, tmp_path / "run", valid,
                **{"trainer.max_signalless_steps": 1, "trainer.steps": 3})
    last = t.fit()
    assert t.step == 3 and t.signalless_steps == 0
    assert lines(capsys.readouterr().err) == []
    assert last["rollout/invalid_call_frac/searcher"] == 0.0 and last["adv/answerer_abs"] > 0


def test_validation_says_each_roles_format_validity(tiny_model_dir, qa_file, tmp_path, capsys):
    t = trainer(tiny_model_dir, qa_file, tmp_path / "run", invalid,
                **{"data.dev": qa_file, "data.dev_size": 3, "trainer.val_every": 1, "trainer.steps": 1})
    t.fit()
    err = capsys.readouterr().err.splitlines()
    assert ("mopd: validation at step 0: every call has an invalid action format; "
            "invalid calls: searcher 1.00, answerer 1.00") in err
    t.engine = ScriptedEngine(t.tokenizer, valid)
    m = t.validate()
    assert m["val/valid_call_frac/searcher"] == 1.0 == m["val/valid_call_frac/answerer"]
    assert m["val/em"] == 1.0     # one candidate per request at evaluation: the right one
    assert capsys.readouterr().err.strip() == ("mopd: validation at step 1: val/em 1.0000; "
                                               "valid calls: searcher 1.00, answerer 1.00")


def test_signal_tokens_count_the_advantage_each_role_trains_on():
    # roles: 0 leader (outcome), 1 searcher (OPD, beta 0.5), 2 answerer (outcome, pg_coef 0)
    specs = [RoleSpec(), RoleSpec(advantage="opd", opd_coef=0.5), RoleSpec(pg_coef=0.0)]
    seqs = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10]]
    roles = [[0, 0, 0, -1], [1, 1, -1], [2, 2, -1]]
    advs = [[0.0, 0.7, 0.0, 0.0], [0.0, 0.0, 0.0], [3.0, 3.0, 0.0]]
    zeros = [[0.0] * len(s) for s in seqs]
    b = build_packed_batch(seqs, roles, advs, zeros)
    b.old_logp = torch.zeros(b.num_tokens)
    b.teacher_logp = torch.zeros(b.num_tokens)
    # position i predicts token i+1: trained positions are the leader's first two, the searcher's
    # first and the answerer's first (each sequence's last token predicts nothing)
    trained = int((b.roles >= 0).sum())
    assert signal_token_counts([b], specs) == [trained, 1.0]       # the leader's 0.7 only
    searcher = (b.roles == 1).nonzero()[0, 0]
    b.teacher_logp[searcher] = -0.25                                # a teacher gap on one searcher token
    assert signal_token_counts([b], specs) == [trained, 2.0]
    specs[1] = RoleSpec(advantage="opd", opd_coef=0.0)
    assert signal_token_counts([b], specs) == [trained, 1.0]


def test_logprob_gap_is_the_mean_absolute_difference_on_trained_tokens():
    seqs, roles = [[1, 2, 3, 4]], [[0, 0, 0, -1]]
    b = build_packed_batch(seqs, roles, [[0.0] * 4], [[-1.0, -2.0, -0.5, 0.0]])
    b.old_logp = torch.tensor([-1.5, -1.0, -0.5, -9.0])[:b.num_tokens]
    total, n = logprob_gap_sums([b])
    mask = b.roles >= 0
    expected = (b.sampling_logp - b.old_logp).abs()[mask]
    assert n == float(mask.sum()) and total == pytest.approx(float(expected.sum()))
    assert total > 0


def test_rollout_logprob_gap_is_logged_when_pi_old_is_recomputed(tiny_model_dir, qa_file, tmp_path):
    cfg = resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path / "hf"))
    t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)
    m = t.train_step()
    # the HF engine samples from the trainer's own fp32 module: the same log-probs
    assert 0 <= m["rollout_logprob_gap"] < 1e-4
    # an engine whose recorded log-probs are not the model's (a scripted one records 0): the gap
    # is the mean |pi_old| of the trained tokens, far from 0
    s = trainer(tiny_model_dir, qa_file, tmp_path / "scripted", invalid)
    assert s.train_step()["rollout_logprob_gap"] > 0.5
    r = trainer(tiny_model_dir, qa_file, tmp_path / "rollout", invalid, **{"trainer.old_logprobs": "rollout"})
    assert "rollout_logprob_gap" not in r.train_step()


def test_rollout_old_logprobs_are_refused_in_bf16(tiny_model_dir, qa_file, tmp_path):
    with pytest.raises(ConfigError, match="old_logprobs=rollout needs float32 training"):
        resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path, **{"trainer.old_logprobs": "rollout",
                                                                                 "model.dtype": "bfloat16"}))
    # the tiny presets' rollout log-probs stay allowed in float32 (CPU's auto)
    assert resolve("tiny_cmas_rl", ["model.dtype=float32"]).trainer.old_logprobs == "rollout"


def test_rollout_old_logprobs_are_refused_where_auto_means_bf16(tiny_model_dir, qa_file, tmp_path, monkeypatch):
    import mopd.train.engine_setup as engine_setup

    cfg = resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path, **{"trainer.old_logprobs": "rollout"}))
    assert cfg.model.dtype == "auto"
    monkeypatch.setattr(engine_setup, "resolve_dtype", lambda name, device: torch.bfloat16)   # as on CUDA
    with pytest.raises(ConfigError, match=r"needs float32 training.*model.dtype=auto trains in bfloat16"):
        PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)


@pytest.mark.parametrize("value", ["-1", "many"])
def test_max_signalless_steps_is_checked(value):
    with pytest.raises(ConfigError, match="max_signalless_steps"):
        resolve("cmas_rl", [f"trainer.max_signalless_steps={value}"])
