"""The decode loop's preallocated pieces: a KV cache that grows in place (kv_layers.preallocated_cache)
and per-row uniforms drawn in blocks (sampling.UniformBlocks) give what the plain ones give."""

import inspect

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from mopd.rollout.kv_layers import PreallocatedLayer, layer_kv, preallocated_cache
from mopd.rollout.sampling import UniformBlocks, row_generator


@pytest.fixture(scope="module")
def model(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_dir).eval()


def decode(model, cache, prompt, steps, select=None):
    """Greedy decode of a left-padded batch into ``cache``; ``select`` = (step, rows) drops rows."""
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    mask = (prompt != -1).long()
    ids = prompt.clamp(min=0)
    out = []
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                       use_cache=True, **{kw: cache}).logits[:, -1]
        pos = mask.sum(-1, keepdim=True)
        for s in range(steps):
            tok = logits.argmax(-1, keepdim=True)
            out.append(tok)
            if select is not None and s == select[0]:
                idx = torch.tensor(select[1])
                cache.batch_select_indices(idx)
                mask, tok, pos = mask[idx], tok[idx], pos[idx]
                out = [o[idx] for o in out]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            logits = model(input_ids=tok, attention_mask=mask, position_ids=pos, use_cache=True,
                           **{kw: cache}).logits[:, -1]
            pos = pos + 1
    return torch.cat(out, 1), logits


@pytest.mark.parametrize("capacity,select", [(0, None), (7, (3, [2, 0])), (200, (5, [1, 2]))])
def test_preallocated_cache_decodes_as_the_dynamic_cache(model, capacity, select):
    g = torch.Generator().manual_seed(capacity)
    prompt = torch.randint(3, model.config.vocab_size, (3, 13), generator=g)
    prompt[0, :4] = -1   # left padding
    prompt[2, :9] = -1
    cache = preallocated_cache(model, capacity)
    assert all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    want_tok, want_logits = decode(model, DynamicCache(config=model.config), prompt, 11, select)
    got_tok, got_logits = decode(model, cache, prompt, 11, select)
    assert torch.equal(got_tok, want_tok)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0)
    ref = DynamicCache(config=model.config)
    decode(model, ref, prompt, 11, select)
    for (k, v), (rk, rv) in zip(layer_kv(cache), layer_kv(ref)):
        assert k.shape == rk.shape and torch.equal(k, rk) and torch.equal(v, rv)
    assert cache.get_seq_length() == ref.get_seq_length() == 13 + 11


def test_preallocated_layer_writes_in_place_until_full():
    layer = PreallocatedLayer(capacity=5)
    k = torch.randn(2, 3, 4, 8)
    layer.update(k, k + 1)
    buf = layer.keys.data_ptr()
    layer.update(k[:, :, :1], k[:, :, :1] + 1)
    assert layer.keys.data_ptr() == buf and layer.get_seq_length() == 5   # the 5th column, in place
    layer.update(k[:, :, :2], k[:, :, :2] + 1)   # past its capacity: a bigger buffer, same contents
    assert layer.get_seq_length() == 7
    torch.testing.assert_close(layer.keys, torch.cat([k, k[:, :, :1], k[:, :, :2]], 2), rtol=0, atol=0)
    torch.testing.assert_close(layer.values, layer.keys + 1, rtol=0, atol=0)
    layer.batch_repeat_interleave(2)
    assert layer.keys.shape[0] == 4 and torch.equal(layer.keys[1], layer.keys[0])
    layer.crop(-3)
    assert layer.get_seq_length() == 4 and torch.equal(layer.values[2], k[1] + 1)


def one_draw_per_step(generators, live_steps):
    """The reference: each live row draws one float64 from its stream per step."""
    out = []
    for live in live_steps:
        u = torch.zeros(len(generators), dtype=torch.float64)
        for i, g in enumerate(generators):
            if live[i]:
                u[i] = torch.rand(1, generator=g, dtype=torch.float64)
        out.append(u)
    return out


@pytest.mark.parametrize("block", [1, 5, 64])
def test_uniform_blocks_give_each_row_its_own_stream_in_order(block):
    g = torch.Generator().manual_seed(block)
    rows, steps = 7, 23
    live_steps = (torch.rand(steps, rows, generator=g) < 0.8).tolist()
    want = one_draw_per_step([row_generator(9, j) for j in range(rows)], live_steps)
    blocks = UniformBlocks([row_generator(9, j) for j in range(rows)], block=block)
    got = [blocks.next(torch.tensor(live)) for live in live_steps]
    for w, x in zip(want, got):
        assert torch.equal(w, x)


def test_uniform_blocks_follow_their_rows_through_select_and_extend():
    a = UniformBlocks([row_generator(1, j) for j in range(4)], block=3)
    b = UniformBlocks([row_generator(2, j) for j in range(2)], block=3)
    ref_a = [row_generator(1, j) for j in range(4)]
    ref_b = [row_generator(2, j) for j in range(2)]
    for _ in range(4):
        a.next(torch.ones(4, dtype=torch.bool))
        for r in ref_a:
            torch.rand(1, generator=r, dtype=torch.float64)
    b.next(torch.ones(2, dtype=torch.bool))
    for r in ref_b:
        torch.rand(1, generator=r, dtype=torch.float64)
    joined = a.select([3, 1]).extend(b)   # rows at different points of their blocks
    refs = [ref_a[3], ref_a[1]] + ref_b
    for _ in range(5):
        got = joined.next(torch.ones(4, dtype=torch.bool))
        want = torch.cat([torch.rand(1, generator=r, dtype=torch.float64) for r in refs])
        assert torch.equal(got, want)
