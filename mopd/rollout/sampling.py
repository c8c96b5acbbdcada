"""Engine-independent sampling pieces: seeds, per-row random streams, one sampling step, stop strings.

Batch invariance: every sampled row owns a CPU ``torch.Generator`` seeded from its request's seed
and its sample index, and uses exactly one uniform per step (drawn 64 at a time:
:class:`UniformBlocks`). A token is then drawn by inverse-CDF
on the row's (top-p filtered) distribution, so what a row samples depends only on its own logits
and seed, never on which other rows share the batch (each row takes the same path whatever the
others' settings), and CPU and CUDA draw the same uniforms.
"""

from __future__ import annotations

import hashlib
from typing import List, Optional, Sequence, Tuple

import torch

SEED_BITS = 62


def derive_seed(*parts) -> int:
    """A stable 62-bit seed from any printable parts (blake2b of their reprs; stable across runs)."""
    h = hashlib.blake2b("\x1f".join(repr(p) for p in parts).encode("utf-8"), digest_size=8)
    return int.from_bytes(h.digest(), "little") >> (64 - SEED_BITS)


def row_generator(seed: Optional[int], sample_index: int) -> torch.Generator:
    """The CPU random stream of sample ``sample_index`` of a request; an unseeded request draws its
    seed from torch's global generator (so ``torch.manual_seed`` still makes runs repeatable)."""
    if seed is None:
        seed = int(torch.randint(0, 2**SEED_BITS, (1,)).item())
    g = torch.Generator(device="cpu")
    g.manual_seed(derive_seed(seed, sample_index))
    return g


def sample_step(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                uniforms: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row and return (tokens [B], log-probs [B] float32).

    ``logits`` [B, V]; ``temperature``/``top_p`` [B] (temperature 0 = greedy); ``uniforms`` [B].
    The log-prob is that of the chosen token under ``softmax(logits / T)`` (T=1 for greedy rows),
    before top-p: top-p only restricts which tokens can be drawn (vLLM's "processed" log-probs
    differ on that point; trainers recompute pi_old anyway).
    """
    logits = logits.float()
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    logp = torch.log_softmax(logits / t[:, None], dim=-1)
    probs = logp.exp()
    u = uniforms.double().unsqueeze(-1)
    # Rows without a nucleus: inverse CDF over the vocabulary in id order (no sort).
    cdf = probs.cumsum(dim=-1).double()
    j = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    sampled = torch.minimum(j, torch.full_like(j, probs.shape[-1] - 1))
    nucleus = (top_p < 1).nonzero().squeeze(-1)
    if nucleus.numel():
        # Rows with top-p < 1: inverse CDF over tokens sorted by probability, truncated to the
        # nucleus (the smallest prefix whose mass reaches top_p; the top token is always kept).
        sorted_p, order = probs[nucleus].sort(dim=-1, descending=True)
        keep = (sorted_p.cumsum(dim=-1) - sorted_p) < top_p[nucleus].float()[:, None]
        keep[:, 0] = True
        ncdf = (sorted_p * keep).cumsum(dim=-1).double()
        jn = torch.searchsorted(ncdf, u[nucleus] * ncdf[:, -1:], right=True).squeeze(-1)
        jn = torch.minimum(jn, keep.sum(dim=-1) - 1)
        sampled[nucleus] = order.gather(-1, jn.unsqueeze(-1)).squeeze(-1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class StopStrings:
    """Token-level stop-string check for one row: after each new token, decode only the tail of
    the generated ids that could hold a stop string and look for one.

    A byte-level token holds at least one byte, so a stop string of b bytes ends within the last
    b tokens; one extra token of context covers a multi-byte character split across tokens.
    """

    def __init__(self, stops: Sequence[str], tokenizer):
        self.stops = tuple(s for s in stops if s)
        self.tokenizer = tokenizer
        self.window = max((len(s.encode("utf-8")) for s in self.stops), default=0) + 1

    def hit(self, generated: List[int]) -> bool:
        if not self.stops:
            return False
        tail = self.tokenizer.decode(generated[-self.window:], skip_special_tokens=False)
        return any(s in tail for s in self.stops)


UNIFORM_BLOCK = 64
"""Uniforms a row draws from its stream at once (:class:`UniformBlocks`)."""


class UniformBlocks:
    """One U[0,1) per live row and step, each row from its own stream, drawn ``block`` at a time:
    row i's t-th uniform is the t-th draw of its own generator (one call for ``block`` values gives the
    same numbers as ``block`` calls for one), so every row samples exactly what one draw per step
    gave it, and a step gathers the batch's uniforms in one tensor operation. A row that ended
    leaves the rest of its block unused (its generator is never read again)."""

    def __init__(self, generators: Sequence[torch.Generator], block: int = UNIFORM_BLOCK):
        self.generators = list(generators)
        self.block = block
        self.values = torch.zeros((len(self.generators), block), dtype=torch.float64)
        self.used = torch.full((len(self.generators),), block, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.generators)

    def next(self, live: torch.Tensor) -> torch.Tensor:
        """The next uniform of every row where ``live`` (a CPU bool [rows]) is true, 0 elsewhere:
        float64 [rows] on the CPU."""
        empty = (self.used >= self.block) & live
        if bool(empty.any()):
            for i in empty.nonzero().flatten().tolist():
                torch.rand(self.block, generator=self.generators[i], dtype=torch.float64, out=self.values[i])
                self.used[i] = 0
        u = self.values.gather(1, self.used.clamp(max=self.block - 1).unsqueeze(1)).squeeze(1)
        self.used += live.long()
        return torch.where(live, u, torch.zeros_like(u))

    def select(self, rows: Sequence[int]) -> "UniformBlocks":
        """The blocks of ``rows`` only, in that order."""
        out = UniformBlocks([self.generators[i] for i in rows], self.block)
        idx = torch.tensor(list(rows), dtype=torch.long)
        out.values, out.used = self.values[idx], self.used[idx]
        return out

    def extend(self, other: "UniformBlocks") -> "UniformBlocks":
        """These rows, then ``other``'s."""
        out = UniformBlocks(self.generators + other.generators, self.block)
        out.values = torch.cat([self.values, other.values])
        out.used = torch.cat([self.used, other.used])
        return out
