"""Seeded question order with a resumable position (each epoch a fresh permutation).

The trainer deals a step's questions with :meth:`QuestionSampler.peek` and moves the position on
with :meth:`QuestionSampler.commit` only once that step's update is applied: a step stopped before
(a lost retriever, Ctrl-C, SIGTERM) leaves the position where the last finished step left it, so
its checkpoint deals the same questions again on ``--resume``.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from mopd.core.qa import load_questions


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

    def peek_indices(self) -> Tuple[List[int], dict]:
        """This rank's indices of the next step and the position after it; the position stays."""
        out: List[int] = []
        epoch, pos = self.epoch, self.pos
        perm = self._perm(epoch)
        while len(out) < self.per_step:
            if pos >= self.n:
                epoch, pos = epoch + 1, 0
                perm = self._perm(epoch)
            take = min(self.per_step - len(out), self.n - pos)
            out.extend(perm[pos:pos + take])
            pos += take
        return out[self.rank::self.world], {"epoch": epoch, "pos": pos}

    def peek(self, items: Sequence) -> Tuple[list, dict]:
        """The next step's items and the position after them (give it to :meth:`commit`)."""
        indices, after = self.peek_indices()
        return [items[i] for i in indices], after

    def commit(self, after: dict) -> None:
        """The step dealt by :meth:`peek` is done: move the position past it."""
        self.load_state_dict(after)

    def next_indices(self) -> List[int]:
        indices, after = self.peek_indices()
        self.commit(after)
        return indices

    def take(self, items: Sequence):
        return [items[i] for i in self.next_indices()]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])


def training_questions(data_cfg) -> Tuple[list, list, int]:
    """``(train questions, dev questions, malformed training rows skipped)`` of ``cfg.data``: the
    dev set cut to its first ``data.dev_size`` questions (fixed across the run)."""
    train, report = load_questions(data_cfg.train, skip_malformed=data_cfg.skip_malformed)
    dev = []
    if data_cfg.dev:
        dev, _ = load_questions(data_cfg.dev, skip_malformed=data_cfg.skip_malformed)
        dev = dev[:data_cfg.dev_size]
    return train, dev, report.skipped
