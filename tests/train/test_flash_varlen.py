"""The packed forward hands flash-attn the sequence boundaries itself (no per-layer host sync)."""

from types import SimpleNamespace

import torch

from mopd.train.model import flash_varlen_kwargs, packed_hidden
from mopd.train.packing import build_packed_batch


def batch_of(lengths):
    toks = [list(range(1, n + 1)) for n in lengths]
    zeros = [[0] * n for n in lengths]
    return build_packed_batch(toks, zeros, [[0.0] * n for n in lengths], [[0.0] * n for n in lengths],
                              pad_to_multiple=8)


def test_varlen_kwargs_are_the_packed_boundaries_and_the_longest_sequence():
    b = batch_of([5, 17, 3])
    kw = flash_varlen_kwargs(b)
    assert kw["cu_seq_lens_q"] is kw["cu_seq_lens_k"] and kw["cu_seq_lens_q"].dtype == torch.int32
    assert kw["cu_seq_lens_q"].tolist() == b.cu_seqlens.tolist() == [0, 5, 22, 25, 32]   # 7 pad tokens at the end
    assert kw["max_length_q"] == kw["max_length_k"] == 17 and isinstance(kw["max_length_q"], int)


def test_flash_forward_receives_them_with_the_restarting_positions():
    seen = {}

    def inner(**kwargs):
        seen.update(kwargs)
        n = kwargs["input_ids"].shape[1]
        return SimpleNamespace(last_hidden_state=torch.arange(n, dtype=torch.float32)[None, :, None].expand(1, n, 4))

    lm = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"), model=inner)
    b = batch_of([4, 9])
    h = packed_hidden(lm, b)
    assert h.shape == (b.num_tokens, 4)
    assert seen["cu_seq_lens_q"].tolist() == [0, 4, 13, 16] and seen["max_length_q"] == 9
    assert torch.equal(seen["position_ids"][0], b.position_ids) and "attention_mask" not in seen
