"""Reuse of the KV cache across turns of a multi-turn call (HFEngine's prefix cache).

A Searcher's or Leader's next prompt is its previous prompt, its sampled tokens, and a new
environment turn. Without reuse every turn prefills the whole conversation again, which on CPU
is most of a rollout's time. The store keeps, for each finished sequence, the keys and values of
its real (unpadded) tokens; a later prompt that extends a stored sequence takes that entry and
prefills only the rest.

Entries are least-recently-stored first out under a byte budget, and a hit removes the entry
(the continuation stores a longer one). Entries are only valid for the weights they were computed
with: the engine clears the store whenever a parameter changes (see ``HFEngine``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import torch

LayerKV = List[Tuple[torch.Tensor, torch.Tensor]]
"""Per layer (keys, values), each [kv_heads, tokens, head_dim]."""


class PrefixStore:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: "OrderedDict[Tuple[int, ...], LayerKV]" = OrderedDict()
        self._by_length: Dict[int, int] = {}
        self.bytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _size(kv: LayerKV) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)

    def put(self, ids: Sequence[int], kv: LayerKV) -> None:
        key = tuple(ids)
        size = self._size(kv)
        if not key or size > self.max_bytes:
            return
        if key in self._entries:
            self._remove(key)
        self._entries[key] = kv
        self._by_length[len(key)] = self._by_length.get(len(key), 0) + 1
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._remove(next(iter(self._entries)))

    def take(self, prompt: Sequence[int]) -> Optional[Tuple[int, LayerKV]]:
        """The longest stored sequence that is a strict prefix of ``prompt`` (at least one prompt
        token is left to prefill), removed from the store; None when there is none."""
        for length in sorted((n for n in self._by_length if n < len(prompt)), reverse=True):
            key = tuple(prompt[:length])
            if key in self._entries:
                kv = self._entries[key]
                self._remove(key)
                self.hits += 1
                self.reused_tokens += length
                return length, kv
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._by_length.clear()
        self.bytes = 0

    def _remove(self, key) -> None:
        kv = self._entries.pop(key)
        self.bytes -= self._size(kv)
        n = self._by_length[len(key)] - 1
        if n:
            self._by_length[len(key)] = n
        else:
            del self._by_length[len(key)]
