"""VLLMStepFront on the real engine: requests join vLLM's running batch between steps, each
resolves with its own completions, and a cancelled or failing request stalls nothing."""

import random
import time

import pytest

from tests.helpers.vllm import require_vllm

require_vllm()

from mopd.core.generation import GenerationRequest, SamplingParams  # noqa: E402
from mopd.rollout.vllm_async_engine import VLLMStepFront, output_request_id  # noqa: E402
from mopd.rollout.work_queue import FrontClosed  # noqa: E402

HANG_GUARD_S = 300
"""A future that has not resolved by then never will (the whole test takes seconds): fail, not hang."""


def mixed_requests(n, seed):
    """Prompts of 3-300 tokens, 1-40 new tokens, greedy and seeded samples, n of 1 to 3."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        prompt = [rng.randrange(5, 700) for _ in range(rng.choice([rng.randint(3, 30), rng.randint(100, 300)]))]
        greedy = i % 4 == 0
        reqs.append(GenerationRequest(prompt, SamplingParams(
            n=1 if greedy else 1 + i % 3, temperature=0.0 if greedy else 2.0, max_new_tokens=rng.randint(1, 40),
            seed=None if greedy else 1000 + i)))
    return reqs


def tokens(outputs):
    return [[c.token_ids for c in o] for o in outputs]


def test_the_id_the_outputs_carry_drops_the_suffix_enqueue_adds():
    assert output_request_id("17-3fa9c2d1") == "17"
    assert output_request_id("17") == "17"


def test_70_concurrent_mixed_requests_all_resolve_with_their_own_completions(vllm_engine, hf_reference):
    reqs = mixed_requests(70, seed=11)
    expected = tokens(vllm_engine.generate(reqs))                # one synchronous batch, same seeds
    front = VLLMStepFront(vllm_engine)
    try:
        futures = [front.submit(r) for r in reqs]
        got = [f.result(timeout=HANG_GUARD_S) for f in futures]
    finally:
        front.close()
    assert tokens(got) == expected
    for req, out in zip(reqs, got):
        assert len(out) == req.params.n
        assert all(len(c.logprobs) == len(c.token_ids) <= req.params.max_new_tokens for c in out)
    greedy = [i for i, r in enumerate(reqs) if r.params.temperature == 0]
    ref = tokens(hf_reference.generate([reqs[i] for i in greedy]))
    assert [tokens(got)[i] for i in greedy] == ref               # each greedy output is its own prompt's
    assert front.meter.busy_s > 0


def test_a_cancelled_and_a_failing_request_do_not_stall_the_others(vllm_engine):
    reqs = mixed_requests(20, seed=12)
    too_long = GenerationRequest([7] * 3000, SamplingParams(max_new_tokens=4))   # > max_model_len
    expected = tokens(vllm_engine.generate(reqs))
    front = VLLMStepFront(vllm_engine)
    try:
        with front._cv:                                            # the worker takes nothing meanwhile
            futures = [front.submit(r) for r in reqs[:10]]
            failing = front.submit(too_long)
            cancelled = front.submit(reqs[0])
            futures += [front.submit(r) for r in reqs[10:]]
            assert cancelled.cancel()
        got = [f.result(timeout=HANG_GUARD_S) for f in futures]
        with pytest.raises(Exception, match="maximum context length"):
            failing.result(timeout=HANG_GUARD_S)
    finally:
        front.close()
    assert cancelled.cancelled()
    assert tokens(got) == expected
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()


def test_closing_mid_rollout_fails_the_unfinished_and_leaves_the_engine_clean(vllm_engine):
    """Closing aborts what is still running: by the ids the engine knows, so nothing is left behind
    for the next ``generate`` to collect."""
    reqs = [GenerationRequest([5 + i] * 40, SamplingParams(temperature=0.0, max_new_tokens=1800)) for i in range(6)]
    front = VLLMStepFront(vllm_engine)
    futures = [front.submit(r) for r in reqs]
    while len(front._running) < len(reqs):                      # all admitted; 1,800 tokens each to go
        time.sleep(0.01)
    front.close()
    closed = [f for f in futures if isinstance(f.exception(timeout=HANG_GUARD_S), FrontClosed)]
    assert closed and all(f.done() for f in futures)
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()
    after = vllm_engine.generate(reqs[:2])
    assert [len(o) for o in after] == [1, 1]
