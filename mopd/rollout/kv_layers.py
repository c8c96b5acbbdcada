"""The per-layer keys and values of a transformers ``DynamicCache``, whatever its version."""

from __future__ import annotations

from typing import List, Tuple

import torch


def layer_kv(cache) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) of every layer of a DynamicCache, [B, kv_heads, T, head_dim] each
    (transformers 5 keeps them in ``cache.layers``, 4.x in ``key_cache``/``value_cache``)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))
