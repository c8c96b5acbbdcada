"""Reuse of the KV cache across turns: the store, and HFEngine with and without it."""

import torch

from mopd.core.generation import GenerationRequest, SamplingParams
from mopd.rollout.chat import continuation_ids
from mopd.rollout.hf_engine import HFEngine
from mopd.rollout.prefix_store import PrefixStore
from mopd.rollout.prompts import render_searcher_prompt


def kv(tokens, layers=2):
    return [(torch.zeros(2, tokens, 4), torch.zeros(2, tokens, 4)) for _ in range(layers)]


def test_store_returns_the_longest_strict_prefix_once():
    s = PrefixStore(1 << 20)
    s.put([1, 2], kv(2))
    s.put([1, 2, 3, 4], kv(4))
    s.put([9, 9, 9], kv(3))
    assert s.take([1, 2, 3, 4])[0] == 2  # the equal-length entry is not a strict prefix
    assert s.take([1, 2, 3, 4, 5])[0] == 4
    assert s.take([1, 2, 3, 4, 5]) is None  # taken entries are gone; [1, 2] was taken first
    assert s.take([7]) is None and len(s) == 1
    s.clear()
    assert len(s) == 0 and s.bytes == 0


def test_store_evicts_oldest_first_under_its_budget():
    one = PrefixStore._size(kv(10))
    s = PrefixStore(3 * one)
    for i in range(5):
        s.put([i] * 10, kv(10))
    assert len(s) == 3 and s.bytes == 3 * one
    assert s.take([0] * 11) is None and s.take([4] * 11)[0] == 10
    s.put([5] * 100, kv(100))  # larger than the whole budget: not kept
    assert s.take([5] * 101) is None


def two_turns(engine, tokenizer, temperature):
    params = SamplingParams(n=2, temperature=temperature, max_new_tokens=10, seed=1)
    first = [GenerationRequest(render_searcher_prompt(tokenizer, q), params) for q in ("A?", "Where is B?")]
    out = engine.generate(first)
    second = [GenerationRequest(r.prompt_ids + c.token_ids + continuation_ids(tokenizer, "more", False), params)
              for r, cs in zip(first, out) for c in cs]
    return out, engine.generate(second)


def test_reused_prefixes_give_the_same_samples_and_logprobs(tiny_dir, tokenizer):
    with_store = HFEngine.from_pretrained(str(tiny_dir), device="cpu")
    without = HFEngine(with_store.model, tokenizer, prefix_cache_mb=0)
    for temperature in (0.0, 1.0):
        a1, a2 = two_turns(with_store, tokenizer, temperature)
        b1, b2 = two_turns(without, tokenizer, temperature)
        for x, y in zip([c for cs in a1 + a2 for c in cs], [c for cs in b1 + b2 for c in cs]):
            assert x.token_ids == y.token_ids
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=1e-4)
    # greedy: the two samples are equal, so 2 distinct second prompts; sampled: 4
    assert with_store.prefix_store.hits == 6 and without.prefix_store is None


def test_changed_weights_clear_the_store(tiny_dir, tokenizer):
    engine = HFEngine.from_pretrained(str(tiny_dir), device="cpu")
    two_turns(engine, tokenizer, 1.0)
    hits = engine.prefix_store.hits
    params = SamplingParams(max_new_tokens=4, seed=0)
    prompt = render_searcher_prompt(tokenizer, "A?")
    c = engine.generate([GenerationRequest(prompt, params)])[0][0]
    with torch.no_grad():
        next(engine.model.parameters()).mul_(1.0)  # an in-place update, as an optimizer step
    engine.generate([GenerationRequest(prompt + c.token_ids + [tokenizer.eos_token_id], params)])
    assert engine.prefix_store.hits == hits


def test_rollouts_and_weight_loads_leave_no_stale_prefixes(tiny_dir, tokenizer):
    from mopd.rollout.run_state import WorkflowSettings
    from mopd.rollout.scheduler import run_workflows
    from tests.helpers.retrievers import FakeRetriever
    from tests.helpers.workflows import questions

    engine = HFEngine.from_pretrained(str(tiny_dir), device="cpu")
    two_turns(engine, tokenizer, 1.0)
    assert len(engine.prefix_store) > 0
    engine.load_weights(engine.model.named_parameters())  # shared tensors: nothing copied, cache cleared
    assert len(engine.prefix_store) == 0
    run_workflows(engine, FakeRetriever(), tokenizer, questions(2), WorkflowSettings(max_output_tokens=6, max_steps=3),
                  attempts=1, progress=False)
    assert engine.prefix_store.hits > 0 and len(engine.prefix_store) == 0
