"""HFEngine: batched sampling with a transformers causal LM, on CPU or CUDA.

All requests of a call (and their ``n`` samples) become rows of one left-padded batch, sorted by
prompt length and cut into chunks of at most ``max_batch_rows`` to limit padding. Each chunk is
one prefill and then one decode step per token with the KV cache; rows that finish (EOS, a stop
string, or their own token limit) are dropped from the batch and the cache at once.

Left padding keeps every row's last prompt token at the same column; position ids are counted
from each row's first real token, so a padded row sees exactly the positions it would alone.
The sampling itself (seeds, top-p, log-probs, stop strings) is in :mod:`mopd.rollout.sampling`.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Iterable, List, Optional, Sequence, Tuple

import torch

from mopd.rollout.engine import Completion, GenerationRequest
from mopd.rollout.sampling import StopStrings, draw_uniforms, row_generator, sample_step


def _eos_ids(model, tokenizer) -> set:
    ids = set()
    for src in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                getattr(model.config, "eos_token_id", None), tokenizer.eos_token_id):
        if src is None:
            continue
        ids.update(src if isinstance(src, (list, tuple)) else [src])
    return {int(i) for i in ids}


class HFEngine:
    """Engine over a transformers model.

    Pass an existing ``nn.Module`` and tokenizer to share the trainer's model object (then
    ``load_weights`` finds the same tensors and copies nothing, and ``sleep``/``wake`` leave the
    model where the trainer keeps it), or use :meth:`from_pretrained` for an engine-owned copy.
    """

    def __init__(self, model, tokenizer, *, max_batch_rows: int = 256, owns_model: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows
        self.owns_model = owns_model
        self.eos_ids = _eos_ids(model, tokenizer)
        if not self.eos_ids:
            raise ValueError("the model and tokenizer define no EOS token")
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids))
        self._device = None
        self._asleep = False
        self._cache_arg: Optional[str] = None

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: str = "auto", device: Optional[str] = None,
                        max_batch_rows: int = 256) -> "HFEngine":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        else:
            torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device)
        model.eval()
        return cls(model, tokenizer, max_batch_rows=max_batch_rows, owns_model=True)

    # ------------------------------------------------------------------------------------
    # Engine protocol
    # ------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> List[List[Completion]]:
        rows = []  # (request index, sample index, prompt, params, generator)
        for i, req in enumerate(requests):
            if not req.prompt_ids:
                raise ValueError(f"request {i} has an empty prompt")
            for j in range(req.params.n):
                rows.append((i, j, req.prompt_ids, req.params, row_generator(req.params.seed, j)))
        out: List[List[Optional[Completion]]] = [[None] * r.params.n for r in requests]
        order = sorted(range(len(rows)), key=lambda k: len(rows[k][2]))
        with self._eval_mode():
            for start in range(0, len(order), self.max_batch_rows):
                chunk = [rows[k] for k in order[start:start + self.max_batch_rows]]
                for (i, j, *_), completion in zip(chunk, self._generate_rows(chunk)):
                    out[i][j] = completion
        return out  # type: ignore[return-value]

    def load_weights(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Copy tensors into the parameters and buffers of the same names; tensors that already
        are the engine's own storage (a shared model) are skipped."""
        own = dict(self.model.named_parameters())
        own.update(dict(self.model.named_buffers()))
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in own:
                    raise KeyError(f"load_weights: the engine's model has no parameter {name!r}")
                dst = own[name]
                if dst.data_ptr() == tensor.data_ptr() and dst.shape == tensor.shape:
                    continue
                dst.copy_(tensor.to(device=dst.device, dtype=dst.dtype))

    def sleep(self) -> None:
        """Owned model on CUDA: move it to CPU and free the cached blocks; otherwise nothing."""
        if self.owns_model and not self._asleep and self.device.type == "cuda":
            self._device = self.device
            self.model.to("cpu")
            torch.cuda.empty_cache()
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self.model.to(self._device)
            self._asleep = False

    # ------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextmanager
    def _eval_mode(self):
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            self.model.train(was_training)

    def _forward(self, input_ids, attention_mask, position_ids, cache):
        """Logits of the last position; ``cache`` (a DynamicCache) is extended in place. Recent
        transformers name the cache argument ``cache``, older ones ``past_key_values``."""
        if self._cache_arg is None:
            params = inspect.signature(self.model.forward).parameters
            self._cache_arg = "cache" if "cache" in params else "past_key_values"
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1, **{self._cache_arg: cache})
        return out.logits[:, -1, :]

    def _generate_rows(self, rows) -> List[Completion]:
        from transformers import DynamicCache

        device = self.device
        n = len(rows)
        lengths = [len(r[2]) for r in rows]
        width = max(lengths)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for k, r in enumerate(rows):
            ids[k, width - lengths[k]:] = torch.tensor(r[2], dtype=torch.long)
            mask[k, width - lengths[k]:] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        params = [r[3] for r in rows]
        temperature = torch.tensor([p.temperature for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device)
        limits = [p.max_new_tokens for p in params]
        stops = [StopStrings(p.stop, self.tokenizer) for p in params]
        gens = [r[4] for r in rows]
        tokens: List[List[int]] = [[] for _ in rows]
        logprobs: List[List[float]] = [[] for _ in rows]
        reasons: List[Optional[str]] = [None] * n

        cache = DynamicCache(config=self.model.config)
        logits = self._forward(ids, mask, positions, cache)
        alive = list(range(n))  # original row index of each batch row
        next_pos = positions[:, -1] + 1
        while alive:
            tok, lp = sample_step(logits, temperature, top_p, draw_uniforms([gens[k] for k in alive], device))
            tok_l, lp_l = tok.tolist(), lp.float().tolist()
            keep = []
            for b, k in enumerate(alive):
                tokens[k].append(tok_l[b])
                logprobs[k].append(lp_l[b])
                if tok_l[b] in self.eos_ids or stops[k].hit(tokens[k]):
                    reasons[k] = "stop"
                elif len(tokens[k]) >= limits[k]:
                    reasons[k] = "length"
                else:
                    keep.append(b)
            if not keep:
                break
            if len(keep) < len(alive):
                idx = torch.tensor(keep, device=device)
                cache.batch_select_indices(idx)
                mask, tok, next_pos = mask[idx], tok[idx], next_pos[idx]
                temperature, top_p = temperature[idx], top_p[idx]
                alive = [alive[b] for b in keep]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            logits = self._forward(tok[:, None], mask, next_pos[:, None], cache)
            next_pos = next_pos + 1
        return [Completion(token_ids=tokens[k], logprobs=logprobs[k], finish_reason=reasons[k] or "length",
                           text=self.tokenizer.decode(tokens[k], skip_special_tokens=True)) for k in range(n)]
