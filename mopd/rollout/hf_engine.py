"""HFEngine: batched sampling with a transformers causal LM, on CPU or CUDA.

All requests of a call (and their ``n`` samples) become rows of one left-padded batch, sorted by
prompt length and cut into chunks of at most ``max_batch_rows`` to limit padding. Each chunk is
one prefill and then one decode step per token with the KV cache; rows that finish (EOS, a stop
string, or their own token limit) stop sampling at once and are dropped from the batch and the
cache as soon as they make up a quarter of it. The KV cache, the mask and the sampled tokens live in
preallocated buffers (a step writes one column; no copy of the cache per token), and the host reads
the tokens every step on the CPU, every ``CHECK_EVERY`` steps on an accelerator.

Left padding keeps every row's last prompt token at the same column; position ids are counted
from each row's first real token, so a padded row sees exactly the positions it would alone.
The sampling itself (seeds, top-p, log-probs, stop strings) is in :mod:`mopd.rollout.sampling`.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Iterable, List, Optional, Sequence, Tuple

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mopd.core.generation import Completion, GenerationRequest
from mopd.core.model_dir import remote_code_trusted
from mopd.rollout.engine import EngineCapabilities, eos_ids_of
from mopd.rollout.hf_continuous import HFStepFront
from mopd.rollout.kv_layers import layer_kv, preallocated_cache
from mopd.rollout.prefix_store import LayerKV, PrefixStore
from mopd.rollout.sampling import StopStrings, UniformBlocks, row_generator, sample_step

CHECK_EVERY = 8
"""Decode steps between two reads of the sampled tokens on an accelerator (each read waits for the
device); on the CPU they are read every step, which costs nothing."""


def _eos_ids(model, tokenizer) -> set:
    return eos_ids_of(tokenizer, getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                      getattr(model.config, "eos_token_id", None))


class HFEngine:
    """Engine over a transformers model.

    Pass an existing ``nn.Module`` and tokenizer to share the trainer's model object (then
    ``load_weights`` finds the same tensors and copies nothing, and ``sleep``/``wake`` leave the
    model where the trainer keeps it), or use :meth:`from_pretrained` for an engine-owned copy (of a
    model directory, or of an adapter directory merged into the base it names).
    """

    def __init__(self, model, tokenizer, *, max_batch_rows: int = 256, owns_model: bool = False,
                 prefix_cache_mb: int = 512, cpu_threads: Optional[int] = 1):
        self.model = model
        self.cpu_threads = cpu_threads
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
        self.prefix_store = PrefixStore(prefix_cache_mb << 20) if prefix_cache_mb > 0 else None
        self._weights_seen = None
        self.read_every: Optional[int] = None
        """Decode steps between the host's reads of the sampled tokens (None: every step on the
        CPU, ``CHECK_EVERY`` on an accelerator)."""

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: str = "auto", device: Optional[str] = None,
                        max_batch_rows: int = 256, prefix_cache_mb: int = 512) -> "HFEngine":
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        else:
            torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                           "float16": torch.float16}[dtype]
        from mopd.core.adapter_dir import adapter_of

        adapter = adapter_of(path)
        base = adapter.base_dir if adapter is not None else path
        tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=remote_code_trusted())
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype, trust_remote_code=remote_code_trusted())
        if adapter is not None:   # W + alpha/r * B A in the weights: a plain model, sampled at plain speed
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter.path).merge_and_unload()
        model = model.to(device)
        model.eval()
        return cls(model, tokenizer, max_batch_rows=max_batch_rows, owns_model=True,
                   prefix_cache_mb=prefix_cache_mb)

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
        self._check_weights()
        out: List[List[Optional[Completion]]] = [[None] * r.params.n for r in requests]
        order = sorted(range(len(rows)), key=lambda k: len(rows[k][2]))
        with self._eval_mode():
            for start in range(0, len(order), self.max_batch_rows):
                chunk = [rows[k] for k in order[start:start + self.max_batch_rows]]
                for (i, j, *_), completion in zip(chunk, self._generate_rows(chunk)):
                    out[i][j] = completion
        return out  # type: ignore[return-value]

    def reset_prefix_cache(self) -> None:
        """Forget every stored prefix (its keys/values belong to the weights they came from).
        ``run_workflows`` calls it before and after each rollout; ``load_weights`` calls it too."""
        if self.prefix_store is not None:
            self.prefix_store.clear()

    def _check_weights(self) -> None:
        """A second guard for direct callers: clear the prefix cache when a parameter's version
        changed since the last call. Most in-place updates bump it (a plain optimizer step,
        ``copy_``); fused optimizers and writes through ``.data`` do not, hence the resets above."""
        seen = tuple((p.data_ptr(), p._version) for p in self.model.parameters())
        if seen != self._weights_seen and self.prefix_store is not None:
            self.prefix_store.clear()
        self._weights_seen = seen

    def load_weights(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Copy tensors into the parameters and buffers of the same names; tensors that already
        are the engine's own storage (a shared model) are skipped. Clears the prefix cache either
        way, so a trainer sharing its model calls this after each update."""
        # remove_duplicate=False: a tied weight answers to both its names (embed_tokens.weight and
        # lm_head.weight), so a full state dict loads as is; the shared storage is written once.
        own = dict(self.model.named_parameters(remove_duplicate=False))
        own.update(dict(self.model.named_buffers(remove_duplicate=False)))
        written = set()
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in own:
                    raise KeyError(f"load_weights: the engine's model has no parameter {name!r}")
                dst = own[name]
                if dst.data_ptr() == tensor.data_ptr() and dst.shape == tensor.shape:
                    continue
                if dst.data_ptr() in written:
                    continue
                dst.copy_(tensor.to(device=dst.device, dtype=dst.dtype))
                written.add(dst.data_ptr())
        self.reset_prefix_cache()

    @property
    def capabilities(self) -> EngineCapabilities:
        """A step-level front (:mod:`mopd.rollout.hf_continuous`), but lock-step is the faster
        scheduler (its Python decode loop shares the interpreter lock with the event loop: 0.57x with
        the 0.7M-parameter model on the CPU, bench/RESULTS.md); sampling log-probs are the trainer's (same model, full
        softmax of the temperature-scaled logits); memory is freed only for an owned copy on a GPU."""
        return EngineCapabilities(step_front=True, prefers_async=False, frees_memory=self._frees_memory(),
                                  shares_trainer_model=not self.owns_model, trainer_logprobs=True)

    def step_front(self, max_rows: int = 256):
        """The continuous-batching front over this engine (requests join between decode steps)."""
        return HFStepFront(self, max_rows=max_rows)

    def _frees_memory(self) -> bool:
        """Only an engine-owned copy on a GPU has memory worth freeing; a shared model is the
        trainer's, and on CPU there is nothing to hand over."""
        return self.owns_model and self.device.type == "cuda"

    def sleep(self, level: int = 1) -> None:
        """Drop the prefix cache; an owned model on CUDA is also freed: level 1 moves it to host
        memory, level 2 releases its storage (the buffers, e.g. rotary tables, are kept on the
        host), after which ``wake_up(["weights"])`` allocates it again and ``load_weights`` fills it."""
        if level < 1:
            raise ValueError(f"sleep level {level}: use 1 (weights to host memory) or 2 (weights freed)")
        self.reset_prefix_cache()
        if self._asleep or not self._frees_memory():
            return
        self._device = self.device
        if level >= 2:
            self._saved_buffers = {n: b.detach().cpu().clone() for n, b in self.model.named_buffers()}
            self.model.to_empty(device="meta")
        else:
            self._saved_buffers = None
            self.model.to("cpu")
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
        self._asleep = True

    def wake_up(self, tags: Optional[Sequence[str]] = None) -> None:
        """``["weights"]`` (or None) brings the model back to its device; ``["kv_cache"]`` has
        nothing to do (the KV cache lives only inside a generate call)."""
        if tags is not None and not set(tags) <= {"weights", "kv_cache"}:
            raise ValueError(f"unknown wake_up tags {sorted(set(tags))}; use ['weights', 'kv_cache']")
        if not self._asleep or (tags is not None and "weights" not in tags):
            return
        saved = getattr(self, "_saved_buffers", None)
        if saved is None:
            self.model.to(self._device)
        else:
            # Fresh, uninitialised storage: load_weights must follow before the next generate().
            self.model.to_empty(device=self._device)
            with torch.no_grad():
                for name, buf in self.model.named_buffers():
                    if name in saved:
                        buf.copy_(saved[name])
            if hasattr(self.model, "tie_weights"):
                self.model.tie_weights()
            self._saved_buffers = None
        self._asleep = False

    # ------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextmanager
    def _eval_mode(self):
        """Eval mode and inference mode; on CPU also ``cpu_threads`` intra-op threads.

        Decoding a small model is a long series of tiny ops: with several OpenMP threads each op
        ends in a barrier, and when another process holds a core every barrier waits for a
        descheduled thread (measured: 35x slower rollouts on a busy 2-core machine). One thread
        is the fast and safe default for CPU generation."""
        was_training = self.model.training
        threads = torch.get_num_threads()
        cpu = self.device.type == "cpu" and self.cpu_threads
        if cpu:
            torch.set_num_threads(self.cpu_threads)
        self.model.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            self.model.train(was_training)
            if cpu:
                torch.set_num_threads(threads)

    def _forward(self, input_ids, attention_mask, position_ids, cache):
        """Logits of the last position; ``cache`` (a DynamicCache) is extended in place. Recent
        transformers name the cache argument ``cache``, older ones ``past_key_values``."""
        if self._cache_arg is None:
            params = inspect.signature(self.model.forward).parameters
            self._cache_arg = "cache" if "cache" in params else "past_key_values"
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1, **{self._cache_arg: cache})
        return out.logits[:, -1, :]

    def _prefill(self, prompts: List[List[int]], room: int = 0):
        """One forward over distinct prompts, reusing stored prefixes: returns the cache, the
        last logits and the attention mask [U, width]. The cache has ``room`` more columns
        preallocated for the tokens to come (:func:`~mopd.rollout.kv_layers.preallocated_cache`).

        Layout: a block of reused keys/values (each row's prefix right-aligned), then the block of
        tokens to prefill (each row's rest right-aligned); the mask marks the real columns, so a
        row may have padding between its two parts. Position ids count real columns only, so
        every real token has the position it has in its own sequence.
        """
        device = self.device
        hits = [self.prefix_store.take(p) if self.prefix_store is not None else None for p in prompts]
        done = [h[0] if h else 0 for h in hits]
        rest = [p[d:] for p, d in zip(prompts, done)]
        wp, ws = max(done), max(len(r) for r in rest)
        ids = torch.full((len(prompts), ws), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), wp + ws), dtype=torch.long)
        for u, (d, r) in enumerate(zip(done, rest)):
            ids[u, ws - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[u, wp - d:wp] = 1
            mask[u, wp + ws - len(r):] = 1
        ids, mask = ids.to(device), mask.to(device)
        cache = preallocated_cache(self.model, wp + ws + room)
        if wp:
            ref = next(h[1] for h in hits if h)
            for layer, (k0, v0) in enumerate(ref):
                keys = k0.new_zeros((len(prompts), k0.shape[0], wp, k0.shape[2]))
                values = v0.new_zeros((len(prompts), v0.shape[0], wp, v0.shape[2]))
                for u, h in enumerate(hits):
                    if h:
                        keys[u, :, wp - h[0]:] = h[1][layer][0]
                        values[u, :, wp - h[0]:] = h[1][layer][1]
                cache.update(keys, values, layer)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, wp:]
        return cache, self._forward(ids, mask, positions, cache), mask

    def _store(self, cache, mask, batch_rows: List[int], sequences: List[List[int]]) -> None:
        """Keep the keys/values of finished rows: batch row b holds sequences[b] minus its last
        token (sampled, never fed), in the first real columns of the mask."""
        if self.prefix_store is None:
            return
        layers = layer_kv(cache)
        for b, seq in zip(batch_rows, sequences):
            n = len(seq) - 1
            cols = mask[b].nonzero().squeeze(-1)[:n]
            kv: LayerKV = [(k[b, :, cols].clone(), v[b, :, cols].clone()) for k, v in layers]
            self.prefix_store.put(seq[:-1], kv)

    def _generate_rows(self, rows) -> List[Completion]:
        """Prefill, then decode the chunk in lock-step. Sampled tokens and log-probs are written
        into device buffers; the host reads them (for EOS, stop strings and token limits) every
        step on the CPU and every ``CHECK_EVERY`` steps on an accelerator, or sooner when a row
        reaches its limit. A row that ended between two reads samples on until the read, and what
        it sampled after its end is dropped: its tokens are the same either way."""
        device = self.device
        n = len(rows)
        params = [r[3] for r in rows]
        limits = [p.max_new_tokens for p in params]
        longest = max(limits)
        # Rows with the same prompt (the n samples of a request) share one prefill; its cache rows
        # are then copied.
        unique: dict = {}
        src = [unique.setdefault(tuple(r[2]), len(unique)) for r in rows]
        prompts: List[List[int]] = [[] for _ in unique]
        for r, u in zip(rows, src):
            prompts[u] = r[2]
        cache, logits, mask = self._prefill(prompts, room=longest)
        if len(prompts) < n:
            idx = torch.tensor(src, device=device)
            cache.batch_select_indices(idx)
            logits, mask = logits[idx], mask[idx]
        temperature = torch.tensor([p.temperature for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device)
        stops = [StopStrings(p.stop, self.tokenizer) for p in params]
        uniforms = UniformBlocks([r[4] for r in rows])
        tokens: List[List[int]] = [[] for _ in rows]
        logprobs: List[List[float]] = [[] for _ in rows]
        reasons: List[Optional[str]] = [None] * n
        check_every = self.read_every or (1 if device.type == "cpu" else CHECK_EVERY)
        # Preallocated: the mask (its new columns are ones: every row attends to what it is fed),
        # and the sampled tokens and log-probs [batch row, step].
        width = mask.shape[1]
        masks = mask.new_ones((n, width + longest))
        masks[:, :width] = mask
        out_tok = torch.empty((n, longest), dtype=torch.long, device=device)
        out_lp = torch.empty((n, longest), dtype=torch.float32, device=device)

        rows_in_batch = list(range(n))  # original row index of each batch row
        running = [True] * n  # per batch row: still generating (as far as the host has read)
        next_pos = mask.sum(-1)
        step = read = 0  # steps sampled; steps the host has read
        while True:
            u = uniforms.next(torch.tensor(running))
            tok, lp = sample_step(logits, temperature, top_p, u.to(device))
            out_tok[:, step] = tok
            out_lp[:, step] = lp
            step += 1
            if step - read >= check_every or step >= min(limits[rows_in_batch[b]] for b, r in enumerate(running) if r):
                self._read(out_tok[:, read:step].tolist(), out_lp[:, read:step].tolist(), rows_in_batch,
                           running, (tokens, logprobs, reasons, limits, stops))
                read = step
            keep = [b for b, r in enumerate(running) if r]
            if not keep:
                self._store(cache, masks[:, :width], list(range(len(running))),
                            [rows[k][2] + tokens[k] for k in rows_in_batch])
                break
            # Drop finished rows once they are a quarter of the batch: each drop copies the whole
            # KV cache, so dropping every row the moment it ends costs more than it saves.
            if 4 * (len(running) - len(keep)) >= len(running):
                ended = [b for b, r in enumerate(running) if not r]
                self._store(cache, masks[:, :width], ended,
                            [rows[rows_in_batch[b]][2] + tokens[rows_in_batch[b]] for b in ended])
                idx = torch.tensor(keep, device=device)
                cache.batch_select_indices(idx)
                masks, tok, next_pos = masks[idx], tok[idx], next_pos[idx]
                out_tok, out_lp = out_tok[idx], out_lp[idx]
                temperature, top_p = temperature[idx], top_p[idx]
                uniforms = uniforms.select(keep)
                rows_in_batch = [rows_in_batch[b] for b in keep]
                running = [True] * len(keep)
            width += 1
            logits = self._forward(tok[:, None], masks[:, :width], next_pos[:, None], cache)
            next_pos = next_pos + 1
        return [Completion(token_ids=tokens[k], logprobs=logprobs[k], finish_reason=reasons[k] or "length",
                           text=self.tokenizer.decode(tokens[k], skip_special_tokens=True)) for k in range(n)]

    def _read(self, toks, lps, rows_in_batch, running, record) -> None:
        """Append what the running rows sampled since the last read ([batch row][step], on the
        host) to their records, up to each row's end (EOS, a stop string, its token limit)."""
        tokens, logprobs, reasons, limits, stops = record
        for b, live in enumerate(running):
            if not live:
                continue
            k = rows_in_batch[b]
            for t, lp in zip(toks[b], lps[b]):
                tokens[k].append(t)
                logprobs[k].append(lp)
                if t in self.eos_ids or stops[k].hit(tokens[k]):
                    reasons[k] = "stop"
                elif len(tokens[k]) >= limits[k]:
                    reasons[k] = "length"
                else:
                    continue
                running[b] = False
                break
