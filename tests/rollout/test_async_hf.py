"""The asynchronous scheduler on the real HF engine (tiny random model, fixed seed): the same records
as the lock-step scheduler, although its engine batches hold other requests.

Token ids, texts, events and steps are identical. Log-probs agree to float32 rounding only: a row's
logits come out of matmuls whose blocking depends on the batch's rows and padding (the lock-step
scheduler's own records move by the same ~1e-6 between ``max_active_runs`` settings).
"""

import itertools

import pytest
import torch

from mopd.rollout.async_scheduler import run_workflows_async
from mopd.rollout.run_state import WorkflowSettings
from mopd.rollout.scheduler import run_workflows
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.workflows import questions

from .test_hf_workflows import STEER, BigramSteer


@pytest.fixture
def steered(request, hf_engine, tokenizer):
    """The tiny model writes a tag chain after each newline (so some runs search or delegate and
    some do not, and the runs' lengths differ)."""
    chain = [tokenizer.encode(t, add_special_tokens=False)[0] for t in STEER[request.param]]
    steer = BigramSteer(hf_engine.model, dict(itertools.pairwise(chain)))
    yield hf_engine
    steer.remove()


def split_logprobs(records):
    """(the records without durations and log-probs, every log-prob in order)."""
    out, logprobs = [], []
    for r in records:
        d = r.to_dict()
        d.pop("duration_s")
        for call in d["calls"]:
            for seg in call["segments"]:
                logprobs.extend(seg.pop("logprobs") or [])
        out.append(d)
    return out, torch.tensor(logprobs)


@pytest.mark.parametrize("workflow,steered", [("cmas", "search"), ("hmas", "subtask")], indirect=["steered"])
def test_async_records_equal_lockstep_records_on_the_hf_engine(steered, tokenizer, workflow):
    settings = WorkflowSettings(workflow=workflow, max_steps=5 if workflow == "cmas" else 8, max_rounds=2,
                                max_output_tokens=10, answer_candidates=2, temperature=1.0, seed=11)
    ref = run_workflows(steered, FakeRetriever(), tokenizer, questions(4), settings, attempts=2,
                        progress=False)
    got = run_workflows_async(steered, FakeRetriever(), tokenizer, questions(4), settings, attempts=2,
                              progress=False)
    (got_records, got_lp), (ref_records, ref_lp) = split_logprobs(got), split_logprobs(ref)
    assert got_records == ref_records  # token ids, texts, events, steps, answers
    torch.testing.assert_close(got_lp, ref_lp, atol=1e-5, rtol=0)
    assert any(e.kind in ("search", "subtask") for r in got for e in r.events)
    assert got.stats.engine_calls > 0 and got.stats.tokens["answerer"] > 0
