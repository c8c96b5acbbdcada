"""A step's records packed into micro-batches and read back per call; the step's bookkeeping."""

import math
import random

import pytest
import torch
from mopd_kernels.terms import STAT_NAMES

from mopd.core.records import AgentCall, Segment, WorkflowRecord
from mopd.core.roles import role_id
from mopd.train.step_batches import pack_records
from mopd.train.step_metrics import LossStats, PhaseTimer


def _call(cid, role, rng, n_turns):
    segs = []
    for _ in range(n_turns):
        segs.append(Segment([rng.randrange(5, 50) for _ in range(rng.randrange(1, 6))], "env", "e"))
        n = rng.randrange(1, 7)
        segs.append(Segment([rng.randrange(5, 50) for _ in range(n)], "model", "m", [-rng.random() for _ in range(n)]))
    return AgentCall(call_id=cid, role=role, segments=segs)


def _records(seed=0, n=5):
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        calls = [_call("l0", "leader", rng, 2), _call("s0", "searcher", rng, 3), _call("a0.0", "answerer", rng, 1)]
        recs.append(WorkflowRecord(question_id=f"q{i}", dataset="d", question="?", answers=["x"], calls=calls))
    return recs


@pytest.mark.parametrize("budget", [17, 40, 1000])
def test_every_trained_token_lands_once_with_its_role_and_log_prob(budget):
    recs = _records()
    own = []
    step = pack_records(recs, budget, device=torch.device("cpu"), agree_count=lambda n: own.append(n) or n + 2)
    assert len(step.batches) == own[0] + 2                 # as many as the ranks agreed on, calls spread over all
    assert {r.batch for r in step.refs} == set(range(len(step.batches)))
    trained = sum(b.loss_tokens for b in step.batches)
    # a call's first token predicts nothing, so a model segment at position 0 would lose a token: none here
    assert trained == sum(len(s.token_ids) for r in recs for c in r.calls for s in c.segments if s.trainable)
    for ref in step.refs:
        b = step.batches[ref.batch]
        mask = b.seq_ids == ref.seq
        roles = b.roles[mask]
        assert set(roles[roles >= 0].tolist()) == {role_id(ref.call.role)}
        want = [lp for s in ref.call.segments if s.trainable for lp in s.logprobs]
        assert b.sampling_logp[mask][roles >= 0].tolist() == pytest.approx(want)


def test_per_call_sums_and_advantages_round_trip():
    recs = _records(seed=1)
    step = pack_records(recs, 30, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    values = [torch.randn(b.num_tokens, generator=g) for b in step.batches]
    sums = step.per_call_sums(values)
    for ref in step.refs:
        b, v = step.batches[ref.batch], values[ref.batch]
        mask = (b.seq_ids == ref.seq) & (b.roles >= 0)
        assert sums[(ref.record, ref.call.call_id)] == pytest.approx(float(v[mask].sum()), abs=1e-5)
    advs = [{"l0": 0.5 + i, "a0.0": -1.0 - i} for i in range(len(recs))]      # the Searcher (OPD) has none
    step.fill_advantages(advs)
    for ref in step.refs:
        b = step.batches[ref.batch]
        got = b.advantages[(b.seq_ids == ref.seq) & (b.roles >= 0)]
        want = advs[ref.record].get(ref.call.call_id, 0.0)
        assert torch.all(got == want)
    assert all(torch.all(b.advantages[b.roles < 0] == 0) for b in step.batches)


def test_loss_stats_weight_roles_by_tokens_and_count_skipped_updates():
    def stats(tokens, entropy):
        return {r: {**{name: torch.tensor(0.0) for name in STAT_NAMES}, "tokens": torch.tensor(float(t)),
                    "entropy_mean": torch.tensor(e)}
                for r, (t, e) in enumerate(zip(tokens, entropy))}

    ls = LossStats()
    ls.add_micro_batch(stats([10, 0, 30], [1.0, 9.0, 2.0]))
    ls.add_micro_batch(stats([30, 5, 0], [3.0, 4.0, 9.0]))
    ls.add_update(0.5, 2.0, applied=True)
    ls.add_update(float("nan"), float("inf"), applied=False)
    m = ls.means()
    assert m["loss/leader_entropy_mean"] == pytest.approx((10 * 1 + 30 * 3) / 40)
    assert m["loss/searcher_entropy_mean"] == pytest.approx(4.0)             # the 0-token row is ignored
    assert m["loss/entropy_mean"] == pytest.approx((10 + 60 + 90 + 20) / 75)
    assert m["loss/total"] == 0.25 and m["loss/grad_norm"] == 1.0 and m["loss/skipped_updates"] == 1.0
    assert all(math.isfinite(v) for v in m.values())


def test_phase_timer_adds_up_repeated_phases():
    t = PhaseTimer()
    for _ in range(3):
        with t("a"):
            pass
    with pytest.raises(RuntimeError), t("b"):
        raise RuntimeError
    assert set(t.seconds) == {"a", "b"} and all(v >= 0 for v in t.seconds.values())
