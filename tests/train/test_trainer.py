"""End-to-end trainer behaviour on a tiny random model (CPU, one process)."""

import json

import pytest
import torch

from mopd.config import resolve
from mopd.rollout.run_state import WorkflowSettings
from mopd.train.model import PackedCausalLM
from mopd.train.trainer import PolicyTrainer, TrainingError
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.training import tiny_overrides


def make_trainer(preset, model_dir, qa_file, out, resume=False, retriever=None, **extra):
    cfg = resolve(preset, tiny_overrides(model_dir, qa_file, out, **extra))
    return PolicyTrainer(cfg, retriever=retriever or FakeRetriever(), resume=resume, progress=False)


def params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_stage1_step_completes_and_logs(tiny_model_dir, qa_file, tmp_path):
    t = make_trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / "run")
    before = params(t.model)
    last = t.fit(2)
    assert t.step == 2
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("rollout/no_search_frac", "perf/rollout_tokens_per_s", "loss/total", "reward/answerer",
                "rollout/busy_fraction", "rollout/tokens_per_s/searcher"):  # the async scheduler's stats
        assert key in rows[-1], key
    assert all(isinstance(v, (int, float)) for v in last.values())
    after = params(t.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "trainer_state.json").is_file()
    assert (tmp_path / "run" / "training.png").is_file()


def test_stage2_step_with_teacher(tiny_model_dir, qa_file, tmp_path):
    t = make_trainer("mopd", tiny_model_dir, qa_file, tmp_path / "run", **{"teacher.path": tiny_model_dir})
    m = t.fit(1)
    assert t.step == 1 and t.frozen.teacher is not None
    # the teacher is the initial policy: its log-probs equal the student's before the update
    assert "loss/total" in m and m["loss/skipped_updates"] == 0.0


def test_teacher_logprobs_equal_direct_forward(tiny_model_dir):
    from transformers import AutoTokenizer

    from mopd.train.packing import build_packed_batch
    from mopd.train.teacher import Teacher

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    teacher = Teacher(tiny_model_dir, student_tokenizer=tok, device=torch.device("cpu"))
    seqs = [[5, 9, 17, 3, 44], [7, 7, 8]]
    z = [[0.0] * len(s) for s in seqs]
    b = build_packed_batch(seqs, [[0] * len(s) for s in seqs], z, z)
    got = teacher.logprobs(b)
    ref = []
    for s in seqs:
        with torch.no_grad():
            lp = torch.log_softmax(teacher.model(input_ids=torch.tensor([s])).logits[0, :-1].float(), -1)
        ref += lp.gather(1, torch.tensor(s[1:])[:, None])[:, 0].tolist() + [None]
    for i, r in enumerate(ref):
        if r is not None:
            assert abs(got[i].item() - r) < 1e-4
    assert not any(p.requires_grad for p in teacher.model.parameters())


def test_teacher_with_other_tokenizer_is_a_clear_error(tiny_model_dir, qa_file, tmp_path):
    from tests.helpers.tiny_model import init_tiny_model
    from mopd.train.model import ModelLoadError

    other = init_tiny_model(tmp_path / "other", corpus_texts=["zebra quartz " * 50], vocab_size=300, hidden=32,
                            layers=1, heads=2, ffn=64)
    with pytest.raises(ModelLoadError, match="does not share the student's tokenizer"):
        make_trainer("mopd", tiny_model_dir, qa_file, tmp_path / "run", **{"teacher.path": str(other)})


def test_resume_is_exact(tiny_model_dir, qa_file, tmp_path):
    small = {"trainer.steps": 4, "trainer.questions_per_step": 1, "rollout.max_output_tokens": 6}
    a = make_trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / "a", **small)
    a.fit(4)
    straight = params(a.model)

    b = make_trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / "b", **small)
    b.fit(2)
    del b
    c = make_trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / "b", resume=True, **small)
    assert c.step == 2
    c.fit(4)
    resumed = params(c.model)
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_export_then_reload_gives_same_logprobs(tiny_model_dir, qa_file, tmp_path):
    from mopd.cli import main
    from mopd.train.model import load_causal_lm
    from mopd.train.packing import build_packed_batch

    t = make_trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / "run")
    t.fit(1)
    seqs = [[5, 9, 17, 3, 44, 2, 8]]
    z = [[0.0] * 7]
    b = build_packed_batch(seqs, [[0] * 7], z, z)
    t.model.eval()
    with torch.no_grad():
        mine = t.policy(b)
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    m2, _ = load_causal_lm(str(tmp_path / "hf"), dtype=torch.float32, device=torch.device("cpu"))
    m2.eval()
    with torch.no_grad():
        assert torch.allclose(PackedCausalLM(m2)(b), mine, atol=1e-5)


def test_fixed_batch_loss_goes_down(tiny_model_dir, qa_file, tmp_path):
    t = make_trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / "run", **{"trainer.lr": 3e-3})
    settings = WorkflowSettings.for_training(t.cfg, seed=1)
    records = t.rollout(t.sampler.take(t.train_questions), settings, attempts=2)
    step = t.score(records)
    # fixed, non-trivial advantages: +1 on the first half of the calls, -1 on the rest
    advs = [dict() for _ in records]
    for i, r in enumerate(step.refs):
        advs[r.record][r.call.call_id] = 1.0 if i % 2 == 0 else -1.0
    step.fill_advantages(advs)
    losses = [t.update(step.batches).means()["loss/total"] for _ in range(6)]
    assert losses[-1] < losses[0]


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
def test_nonfinite_loss_is_skipped_logged_then_stops(tiny_model_dir, qa_file, tmp_path, monkeypatch):
    from mopd_kernels import FusedLinearPolicyLoss

    real = FusedLinearPolicyLoss.forward
    calls = {"n": 0}

    def poisoned(*a, **k):
        loss, stats = real(*a, **k)
        calls["n"] += 1
        return loss * float("nan"), stats

    monkeypatch.setattr(FusedLinearPolicyLoss, "forward", poisoned)
    t = make_trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / "run", **{"trainer.max_bad_steps": 3})
    before = params(t.model)
    m = t.train_step()                        # two mini-batches, both poisoned: skipped, not applied
    assert m["loss/skipped_updates"] == 2.0
    after = params(t.model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events if e["kind"] == "nonfinite"] == ["nonfinite", "nonfinite"]
    with pytest.raises(TrainingError, match="non-finite updates in a row"):
        t.train_step()
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_lost_retriever_stops_cleanly_with_checkpoint(tiny_model_dir, qa_file, tmp_path):
    t = make_trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / "run", retriever=FakeRetriever(fail_after=0),
                     **{"rollout.max_output_tokens": 4})
    # a random model rarely searches: force a search through a scripted rollout
    from mopd.retriever import RetrieverUnavailable

    def rollout_that_searches(*a, **k):
        raise RetrieverUnavailable("http://127.0.0.1:9 unreachable after 5 retries")

    t.rollout_fn = rollout_that_searches
    with pytest.raises(TrainingError, match="retriever is unreachable"):
        t.fit(2)
    assert (tmp_path / "run" / "checkpoints" / "step_000000").is_dir()


def test_rollout_old_logprobs_match_recompute_and_skip_the_forward(tiny_model_dir, qa_file, tmp_path):
    """pi_old from the engine's sampling log-probs: the same update as recomputing it, one forward fewer."""
    runs = {}
    for mode in ("recompute", "rollout"):
        t = make_trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / mode, **{"trainer.old_logprobs": mode})
        calls = []
        forward = t.policy.forward

        def counting(batch, loss=None, _f=forward, **kw):
            calls.append("loss" if loss is not None else "logprobs")
            return _f(batch, loss, **kw)

        t.policy.forward = counting
        m = t.fit(1)
        runs[mode] = (m, params(t.model), calls)
    (m_re, p_re, c_re), (m_ro, p_ro, c_ro) = runs["recompute"], runs["rollout"]
    assert "logprobs" in c_re and "logprobs" not in c_ro
    # two mini-batches: the second one's ratio and KL estimate depend on pi_old being right
    assert m_ro["loss/approx_kl"] == pytest.approx(m_re["loss/approx_kl"], abs=1e-6)
    assert m_ro["loss/clip_frac"] == m_re["loss/clip_frac"]
    assert m_ro["loss/grad_norm"] == pytest.approx(m_re["loss/grad_norm"], rel=1e-3)
    for k in p_re:
        torch.testing.assert_close(p_ro[k], p_re[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bad", [{"rollout.top_p": 0.9}, {"rollout.engine": "vllm"}])
def test_rollout_old_logprobs_refuse_mismatched_engines(bad, tiny_model_dir, qa_file, tmp_path):
    from mopd.config import ConfigError

    with pytest.raises(ConfigError, match="old_logprobs=rollout"):
        resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path, **{"trainer.old_logprobs": "rollout"},
                                          **bad))


def test_close_shuts_the_engine_down_before_the_process_group(tiny_model_dir, qa_file, tmp_path):
    """Under torchrun vLLM's engine lives on the trainer's group and must be shut down while it lives."""
    import torch.distributed as dist

    t = make_trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / "run")
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    t._owns_process_group = True                       # as init_distributed() under torchrun

    class Engine:
        group_alive_at_close = []

        def close(self):
            self.group_alive_at_close.append(dist.is_initialized())

    t.engine = Engine()
    t.close()
    assert Engine.group_alive_at_close == [True] and not dist.is_initialized()
