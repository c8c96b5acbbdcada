"""VLLMEngine on the real vLLM engine (CPU build): start-up from the project's own keyword
arguments, completions the records take, log-probs against the HF engine, seeded sampling."""

import dataclasses
import math
import random

import torch

from tests.helpers.vllm import require_vllm

vllm = require_vllm()

from mopd.core.generation import GenerationRequest, SamplingParams  # noqa: E402
from mopd.rollout.vllm_engine import CPU_KV_CACHE_BYTES, current_platform  # noqa: E402

LOGPROB_TOL = 2e-4
"""|vLLM - HF| per token log-prob, both float32 (observed below 1e-5; kernels differ in summation order)."""


def hf_logprobs(hf_engine, prompt, completion, temperature=1.0):
    """Teacher-forced log-probs of ``completion`` after ``prompt`` under the HF model at ``temperature``."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = hf_engine.model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


def random_prompts(n, seed, lo=3, hi=40, vocab=700):
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def test_the_engine_starts_from_engine_kwargs_with_the_cpu_defaults(vllm_engine):
    from vllm.engine.arg_utils import EngineArgs

    assert set(vllm_engine.kwargs) <= {f.name for f in dataclasses.fields(EngineArgs)}
    config = vllm_engine.llm.llm_engine.vllm_config
    platform = current_platform()
    assert config.model_config.enable_sleep_mode == platform.sleep_mode
    if platform.cpu:
        assert config.model_config.dtype == torch.float32          # model.dtype=auto on a CPU
        assert config.cache_config.kv_cache_memory_bytes == CPU_KV_CACHE_BYTES
        assert not config.scheduler_config.enable_chunked_prefill
        assert vllm_engine.weight_dtype == torch.float32
    assert config.model_config.max_model_len == 1800 + 48


def test_generate_returns_token_ids_and_logprobs_that_match_the_hf_model(vllm_engine, hf_reference):
    tok = vllm_engine.tokenizer
    prompts = random_prompts(5, seed=1)
    stop_text = tok.decode([prompts[0][0]])
    reqs = [GenerationRequest(p, SamplingParams(n=1 + i % 3, temperature=[1.0, 0.7][i % 2], max_new_tokens=5 + 7 * i,
                                                seed=100 + i, stop=(stop_text,) if i == 4 else ()))
            for i, p in enumerate(prompts)]
    outs = vllm_engine.generate(reqs)
    assert [len(o) for o in outs] == [r.params.n for r in reqs]
    for req, samples in zip(reqs, outs):
        for c in samples:
            assert 1 <= len(c.token_ids) <= req.params.max_new_tokens
            assert len(c.logprobs) == len(c.token_ids) and all(math.isfinite(x) and x <= 0 for x in c.logprobs)
            assert c.finish_reason in ("stop", "length")
            assert c.finish_reason == "stop" or len(c.token_ids) == req.params.max_new_tokens
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            ref = hf_logprobs(hf_reference, req.prompt_ids, c.token_ids, req.params.temperature)
            assert max(abs(a - b) for a, b in zip(c.logprobs, ref)) < LOGPROB_TOL


def test_greedy_decoding_equals_the_hf_engine_token_for_token(vllm_engine, hf_reference):
    reqs = [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=24)) for p in random_prompts(6, seed=2)]
    ours = [o[0] for o in vllm_engine.generate(reqs)]
    ref = [o[0] for o in hf_reference.generate(reqs)]
    assert [c.token_ids for c in ours] == [c.token_ids for c in ref]
    assert len({tuple(c.token_ids) for c in ours}) > 1          # prompts lead to different outputs


def test_seeded_requests_resample_the_same_tokens_in_any_batch_even_with_long_prompts(vllm_engine):
    """Seeds are per request. Six 1,500-token prompts exceed one step's token budget: with chunked
    prefill a seeded prompt would be split across steps, which vLLM's CPU generator cannot rewind
    ("CPU Generator does not use offset"); the CPU defaults schedule each prompt whole."""
    long = random_prompts(6, seed=3, lo=1500, hi=1500)
    short = random_prompts(6, seed=4)
    # T=2 (vLLM's maximum) undoes part of the peaked model's scaling, so samples differ from one another
    reqs = [GenerationRequest(p, SamplingParams(n=2, temperature=2.0, max_new_tokens=8, seed=7 + i))
            for i, p in enumerate(long + short)]
    first = vllm_engine.generate(reqs)
    shuffled = list(range(len(reqs)))
    random.Random(0).shuffle(shuffled)
    again = vllm_engine.generate([reqs[i] for i in shuffled])
    alone = vllm_engine.generate(reqs[:1] + reqs[-1:])
    tokens = [[c.token_ids for c in o] for o in first]
    assert [[c.token_ids for c in o] for o in again] == [tokens[i] for i in shuffled]
    assert [[c.token_ids for c in o] for o in alone] == [tokens[0], tokens[-1]]
    assert tokens[0][0] != tokens[0][1]                          # the n samples of a request differ
    other_seed = vllm_engine.generate([GenerationRequest(reqs[-1].prompt_ids,
                                                         SamplingParams(n=2, temperature=2.0, max_new_tokens=8,
                                                                        seed=999))])
    assert [c.token_ids for c in other_seed[0]] != tokens[-1]

