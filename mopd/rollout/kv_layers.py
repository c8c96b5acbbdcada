"""The per-layer keys and values of a transformers ``DynamicCache``, whatever its version, and a
DynamicCache whose layers grow in preallocated buffers (no copy of the whole cache per decode step)."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch


def layer_kv(cache) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) of every layer of a DynamicCache, [B, kv_heads, T, head_dim] each
    (transformers 5 keeps them in ``cache.layers``, 4.x in ``key_cache``/``value_cache``)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _dynamic_layer_class():
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:   # transformers 4.x: no per-layer cache objects
        return None
    return DynamicLayer


_DynamicLayer = _dynamic_layer_class()

if _DynamicLayer is not None:
    class PreallocatedLayer(_DynamicLayer):
        """A ``DynamicLayer`` whose keys and values are views of the first ``length`` columns of a
        buffer with room for more: a decode step writes one column in place instead of
        concatenating (copying) the whole layer. ``keys``/``values`` stay the exact-width tensors a
        DynamicLayer has, so masks, attention and :func:`layer_kv` see no difference.

        The buffer holds ``capacity`` columns at first (the prompt plus the tokens still to come);
        an update past it moves to a buffer half again as large."""

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity = capacity
            self.length = 0
            self._kbuf: Optional[torch.Tensor] = None
            self._vbuf: Optional[torch.Tensor] = None

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            self.is_initialized = True

        def _resize(self, batch_rows: Optional[torch.Tensor], capacity: int) -> None:
            """Move to buffers of ``capacity`` columns (keeping only ``batch_rows``, if given)."""
            k, v = self.keys, self.values
            if batch_rows is not None:
                k, v = k.index_select(0, batch_rows), v.index_select(0, batch_rows)
            kb = k.new_empty((k.shape[0], k.shape[1], capacity, k.shape[3]))
            vb = v.new_empty((v.shape[0], v.shape[1], capacity, v.shape[3]))
            kb[:, :, :self.length].copy_(k)
            vb[:, :, :self.length].copy_(v)
            self._kbuf, self._vbuf = kb, vb
            self._views()

        def _views(self) -> None:
            self.keys = self._kbuf[:, :, :self.length]
            self.values = self._vbuf[:, :, :self.length]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, add = self.length, key_states.shape[-2]
            if self._kbuf is None:
                shape = list(key_states.shape)
                shape[2] = max(self.capacity, add)
                self._kbuf = key_states.new_empty(shape)
                shape[3] = value_states.shape[3]
                self._vbuf = value_states.new_empty(shape)
            elif n + add > self._kbuf.shape[2]:
                self._resize(None, (n + add) * 3 // 2 + 16)
            self._kbuf[:, :, n:n + add].copy_(key_states)
            self._vbuf[:, :, n:n + add].copy_(value_states)
            self.length = n + add
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.length > 0:
                self._resize(indices.to(self._kbuf.device), self._kbuf.shape[2])

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.length > 0:
                rows = torch.arange(self._kbuf.shape[0], device=self._kbuf.device).repeat_interleave(repeats)
                self._resize(rows, self._kbuf.shape[2])

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            self.batch_select_indices(beam_idx)

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError("crop takes the negative number of tokens to remove")
            if self.length > 0:
                self.length = max(0, self.length + tokens_to_remove)
                self._views()

        def reset(self) -> None:
            self.length = 0
            self._kbuf = self._vbuf = None
            super().reset()


def preallocated_cache(model, capacity: int):
    """A DynamicCache for ``model`` whose layers write into buffers of ``capacity`` columns
    (:class:`PreallocatedLayer`); a plain DynamicCache where that does not apply (transformers 4.x,
    or a model with sliding-window or other special layers)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    layers = getattr(cache, "layers", None)
    if _DynamicLayer is not None and layers and all(type(layer) is _DynamicLayer for layer in layers):
        cache.layers = [PreallocatedLayer(capacity) for _ in layers]
    return cache
