"""Seeded question order with a resumable position (each epoch a fresh permutation)."""

from __future__ import annotations

from typing import List, Sequence

import torch


class QuestionSampler:
    """Deals ``per_step`` questions per step; rank r of ``world`` takes every world-th of them."""

    def __init__(self, n: int, per_step: int, seed: int, rank: int = 0, world: int = 1):
        if n == 0:
            raise ValueError("the training set is empty")
        self.n, self.per_step, self.seed, self.rank, self.world = n, per_step, seed, rank, world
        self.epoch, self.pos = 0, 0

    def _perm(self, epoch: int) -> List[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def next_indices(self) -> List[int]:
        out: List[int] = []
        perm = self._perm(self.epoch)
        while len(out) < self.per_step:
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                perm = self._perm(self.epoch)
            take = min(self.per_step - len(out), self.n - self.pos)
            out.extend(perm[self.pos:self.pos + take])
            self.pos += take
        return out[self.rank::self.world]

    def take(self, items: Sequence):
        return [items[i] for i in self.next_indices()]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])
