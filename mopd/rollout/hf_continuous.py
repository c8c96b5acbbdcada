"""Continuous batching on the HF engine: requests join the running batch between decode steps and
leave it the step they finish, as in vLLM.

:class:`HFStepFront` owns an :class:`~mopd.rollout.hf_engine.HFEngine` from one worker thread and
reuses its pieces (prefill with the prefix store, one forward, seeded sampling, stop strings):

1. newly submitted requests are prefilled together (their ``n`` samples share one prefill) and
   sample their first token;
2. their rows join the running batch: both parts are left-padded to the same cache width (keys
   and values zero, mask 0; positions come from each row's own count of real tokens, so padding
   never moves a token) and concatenated along the batch;
3. one decode step runs for every row; a row that ends (EOS, stop string, token limit) stores its
   keys/values in the prefix store, and its request resolves once all its samples ended; ended
   rows leave the batch once they are a quarter of it, and cache columns that no row uses any
   more are cut off.

Without this, a synchronous ``generate`` call runs to its longest sequence, so an asynchronous
scheduler either waits to gather a big batch or pays each small batch's tail. A row samples from
its own seeded stream (one uniform per step), so what it samples does not depend on when it joined
or what it shares a step with, up to float rounding of batched matmuls.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from mopd.core.generation import Completion, GenerationRequest
from mopd.rollout.engine_worker import cuda_device_keeper, request_rows
from mopd.rollout.kv_layers import layer_kv, preallocated_cache
from mopd.rollout.rollout_stats import BusyMeter
from mopd.rollout.sampling import StopStrings, UniformBlocks, row_generator, sample_step
from mopd.rollout.work_queue import FrontClosed, WorkQueue

JOIN_EVERY = 8
"""Decode steps a request waits at most before it joins a running batch (see HFStepFront._admit)."""


@dataclass
class _Request:
    request: GenerationRequest
    future: Future
    submitted: float
    done: List[Optional[Completion]] = field(default_factory=list)


@dataclass
class _Row:
    owner: _Request
    sample: int
    generator: torch.Generator
    stops: StopStrings
    tokens: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    reason: Optional[str] = None


class _Batch:
    """The running rows and their tensors: cache [B, heads, W, dim] per layer, mask [B, W], the last
    sampled token of each row (not yet in the cache) and its position, and the rows' uniforms."""

    def __init__(self, rows, cache, mask, tok, pos, temperature, top_p):
        self.rows, self.cache, self.mask, self.tok, self.pos = rows, cache, mask, tok, pos
        self.temperature, self.top_p = temperature, top_p
        self.uniforms = UniformBlocks([row.generator for row in rows])


def _room(rows) -> int:
    """Tokens the rows may still sample (the cache columns to preallocate)."""
    return max(row.owner.request.params.max_new_tokens - len(row.tokens) for row in rows)


def _new_cache(model, layers, room: int):
    cache = preallocated_cache(model, layers[0][0].shape[2] + room if layers else room)
    for i, (k, v) in enumerate(layers):
        cache.update(k, v, i)
    return cache


def _stack_left(a: torch.Tensor, b: torch.Tensor, width: int) -> torch.Tensor:
    """``a`` over ``b`` along the batch, each right-aligned in ``width`` columns (dim 2 of a cache
    tensor, dim 1 of a mask); zeros on the left. One copy."""
    dim = 1 if a.dim() == 2 else 2
    shape = list(a.shape)
    shape[0], shape[dim] = a.shape[0] + b.shape[0], width
    out = a.new_zeros(shape)
    out.narrow(0, 0, a.shape[0]).narrow(dim, width - a.shape[dim], a.shape[dim]).copy_(a)
    out.narrow(0, a.shape[0], b.shape[0]).narrow(dim, width - b.shape[dim], b.shape[dim]).copy_(b)
    return out


class HFStepFront(WorkQueue):
    def __init__(self, engine, *, max_rows: int = 256, name: str = "mopd-hf"):
        if max_rows < 1:
            raise ValueError(f"max_rows={max_rows} must be >= 1")
        self.engine, self.max_rows = engine, max_rows
        self.meter = BusyMeter()
        WorkQueue.__init__(self, "request")
        self._held = 0
        self.start_workers(name, on_worker=cuda_device_keeper())

    def submit(self, request: GenerationRequest) -> Future:
        if not request.prompt_ids:
            raise ValueError("a request has an empty prompt")
        return WorkQueue.submit(self, request)

    # ------------------------------------------------------------------ worker
    def _admit(self, running: int) -> Optional[List[_Request]]:
        """Requests to add now (waiting for one when nothing runs); None once closed.

        Joining copies the whole cache, so while rows run, newcomers join in groups: once their
        rows are a quarter of the running ones, or the oldest has waited ``JOIN_EVERY`` steps."""
        with self._cv:
            while not self._pending and not running and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            if running and self._pending:
                self._held += 1
                if 4 * self.pending_size(request_rows) < running and self._held < JOIN_EVERY:
                    return []
            self._held = 0
            # the batch is full at max_rows: the rest joins as rows leave (an oversized request goes alone)
            return [_Request(r, fut, t, [None] * r.params.n)
                    for r, fut, t in self.take_fitting(self.max_rows, request_rows, used=running)]

    def _loop(self) -> None:
        batch: Optional[_Batch] = None
        with self.engine._eval_mode():
            while True:
                new = self._admit(len(batch.rows) if batch is not None else 0)
                if new is None:
                    break
                try:
                    start = time.perf_counter()
                    if new:
                        batch = self._join(batch, self._prefill(new))
                    if batch is not None:
                        batch = self._step(batch)
                    self.meter.work(time.perf_counter() - start, len(batch.rows) if batch is not None else 0)
                except BaseException as e:  # every request in flight gets the error; the front goes on
                    owners = [x.owner for x in (batch.rows if batch is not None else [])] + new
                    for r in owners:
                        if not r.future.done():
                            r.future.set_exception(e)
                    batch = None
        if batch is not None:
            for row in batch.rows:
                if not row.owner.future.done():
                    row.owner.future.set_exception(FrontClosed("the rollout ended before this request ended"))

    def _prefill(self, new: List[_Request]) -> _Batch:
        """New rows after their prefill and first sampled token."""
        eng = self.engine
        eng._check_weights()
        device = eng.device
        rows = [_Row(r, j, row_generator(r.request.params.seed, j),
                     StopStrings(r.request.params.stop, eng.tokenizer))
                for r in new for j in range(r.request.params.n)]
        unique: dict = {}
        src = [unique.setdefault(tuple(row.owner.request.prompt_ids), len(unique)) for row in rows]
        prompts = [list(p) for p in unique]
        cache, logits, mask = eng._prefill(prompts, room=max(r.request.params.max_new_tokens for r in new))
        if len(prompts) < len(rows):  # the n samples of a request share its prefill
            idx = torch.tensor(src, device=device)
            cache.batch_select_indices(idx)
            logits, mask = logits[idx], mask[idx]
        params = [row.owner.request.params for row in rows]
        b = _Batch(rows, cache, mask, None, mask.sum(-1),
                   torch.tensor([p.temperature for p in params], device=device),
                   torch.tensor([p.top_p for p in params], device=device))
        self._sample(b, logits)
        return b

    def _sample(self, b: _Batch, logits: torch.Tensor) -> None:
        live = [i for i, row in enumerate(b.rows) if row.reason is None]
        u = b.uniforms.next(torch.tensor([row.reason is None for row in b.rows]))
        tok, lp = sample_step(logits, b.temperature, b.top_p, u.to(logits.device))
        b.tok = tok
        tok_l, lp_l = tok.tolist(), lp.float().tolist()
        eos = self.engine.eos_ids
        ended = []
        for i in live:
            row = b.rows[i]
            row.tokens.append(tok_l[i])
            row.logprobs.append(lp_l[i])
            if tok_l[i] in eos or row.stops.hit(row.tokens):
                row.reason = "stop"
            elif len(row.tokens) >= row.owner.request.params.max_new_tokens:
                row.reason = "length"
            else:
                continue
            ended.append(i)
        if ended:
            sequences = [b.rows[i].owner.request.prompt_ids + b.rows[i].tokens for i in ended]
            self.engine._store(b.cache, b.mask, ended, sequences)
            for i in ended:
                self._finish(b.rows[i])

    def _finish(self, row: _Row) -> None:
        r = row.owner
        text = self.engine.tokenizer.decode(row.tokens, skip_special_tokens=True)
        r.done[row.sample] = Completion(token_ids=row.tokens, logprobs=row.logprobs, finish_reason=row.reason,
                                        text=text)
        if all(c is not None for c in r.done):
            self.meter.wait(time.perf_counter() - r.submitted)
            if not r.future.done():
                r.future.set_result(list(r.done))

    def _join(self, old: Optional[_Batch], new: _Batch) -> Optional[_Batch]:
        new = self._compact(new)
        old = self._compact(old) if old is not None else None
        if old is None or new is None:
            return old or new
        width = max(old.mask.shape[1], new.mask.shape[1])
        layers = [(_stack_left(ko, kn, width), _stack_left(vo, vn, width))
                  for (ko, vo), (kn, vn) in zip(layer_kv(old.cache), layer_kv(new.cache))]
        joined = _Batch(old.rows + new.rows, _new_cache(self.engine.model, layers, _room(old.rows + new.rows)),
                        _stack_left(old.mask, new.mask, width),
                        torch.cat([old.tok, new.tok]), torch.cat([old.pos, new.pos]),
                        torch.cat([old.temperature, new.temperature]), torch.cat([old.top_p, new.top_p]))
        joined.uniforms = old.uniforms.extend(new.uniforms)
        return joined

    def _compact(self, b: _Batch, force: bool = True) -> Optional[_Batch]:
        """Drop ended rows (``force``, or once they are a quarter of the batch) and the cache
        columns no remaining row uses; None when no row is left."""
        keep = [i for i, row in enumerate(b.rows) if row.reason is None]
        if not keep:
            return None
        if len(keep) < len(b.rows) and (force or 4 * (len(b.rows) - len(keep)) >= len(b.rows)):
            idx = torch.tensor(keep, device=b.mask.device)
            b.cache.batch_select_indices(idx)
            uniforms = b.uniforms.select(keep)
            b = _Batch([b.rows[i] for i in keep], b.cache, b.mask[idx], b.tok[idx], b.pos[idx],
                       b.temperature[idx], b.top_p[idx])
            b.uniforms = uniforms
            used = b.mask.any(0).nonzero()
            first = int(used[0]) if used.numel() else 0
            if first:  # columns left of every row's first real token: padding only
                layers = [(k[:, :, first:], v[:, :, first:]) for k, v in layer_kv(b.cache)]
                b.cache, b.mask = _new_cache(self.engine.model, layers, _room(b.rows)), b.mask[:, first:]
        return b

    def _step(self, b: _Batch) -> Optional[_Batch]:
        b = self._compact(b, force=False)
        if b is None:
            return None
        b.mask = torch.cat([b.mask, torch.ones_like(b.mask[:, :1])], dim=1)
        logits = self.engine._forward(b.tok[:, None], b.mask, b.pos[:, None], b.cache)
        b.pos = b.pos + 1
        self._sample(b, logits)
        return b
