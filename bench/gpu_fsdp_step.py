"""The GPU training path piece by piece, on one GPU through FSDP2 (world size 1), timed by phase.

Run by ``bench/gpu_check.sh`` (``--dry-run``: CPU, gloo, tiny sizes, for CI). With a random
Qwen3-architecture model (hidden 1024, 8 layers by default) it runs the colocated cycle the
trainer runs, each phase timed in tokens per second:

  rollout (an engine-owned HF copy) -> release (sleep level 2) ->
  pi_old scoring -> teacher scoring (bf16 replica, only the Searcher calls) -> two AdamW steps
  (fp32 masters, bf16 compute, fused loss head) -> refresh (weights streamed into the engine) ->
  checkpoint save and load (mopd.train.checkpoint, DCP) -> where vLLM imports: vLLM rollout, one
  VLLMStepFront round trip, sleep / wake / load / generate compared with the trainer's model

and checks what each phase promises: finite losses, weights that moved, the engine holding the
policy's weights after the refresh, the level-2 sleep freeing memory, partial teacher scoring
equal to full scoring where it is read, and an exact checkpoint round trip. One JSON line
(``FSDP_STEP {...}``) and PASS/FAIL lines.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_process_group(cuda: bool) -> None:
    """World size 1, as torchrun would set it up (the vLLM engine then takes the external launcher)."""
    import torch
    import torch.distributed as dist

    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        os.environ.setdefault(k, v)
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo")


def random_batches(vocab: int, n: int, tokens: int, seed: int):
    """``n`` packed micro-batches of about ``tokens`` tokens: calls of 64..1024 tokens (at most half
    a micro-batch, so each holds two calls or more), their roles in turn (Leader, Searcher, Answerer,
    ...), so every micro-batch has Searcher calls and others: the partial teacher pass is checked on
    a mix. (The roles were drawn at random: the tiny tokenizer's vocabulary changed with the role
    prompts, which changed the draws, and a dry-run micro-batch ended up with no Searcher call.)"""
    import random

    from mopd.train.packing import build_packed_batch

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        toks, roles, total = [], [], 0
        while total < tokens:
            length = min(rng.randint(64, 1024) // 8 * 8 or 8, tokens - total, max(8, tokens // 2))
            if length < 2:
                break
            role = len(toks) % 3
            toks.append([rng.randrange(3, vocab) for _ in range(length)])
            roles.append([-1] * (length // 2) + [role] * (length - length // 2))
            total += length
        advs = [[rng.uniform(-1, 1)] * len(t) for t in toks]
        out.append(build_packed_batch(toks, roles, advs, [[0.0] * len(t) for t in toks], pad_to_multiple=8))
    return out


class Clock:
    def __init__(self, sync):
        self.sync, self.times = sync, {}

    def __call__(self, name):
        clock = self

        class _Span:
            def __enter__(self):
                clock.sync()
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                clock.sync()
                clock.times[name] = clock.times.get(name, 0.0) + time.perf_counter() - self.t

        return _Span()


def vllm_cycle(model_dir, prompts, hf_engine, lm, cuda, clock, res, checks) -> None:
    """The vLLM engine as the trainer drives it: a rollout, one round trip through the continuous-
    batching front the async scheduler uses (``VLLMStepFront``), then sleep (level 2) / wake the
    weights / stream them in / wake the KV cache / generate, and the woken engine's greedy tokens
    scored by the trainer's weights (``hf_engine`` holds them since its own refresh): their
    log-probs must be the engine's, which weights left undefined by the sleep would not give.
    Also runs on vLLM's CPU build (``--dry-run`` in .venv-vllm), where sleep keeps the weights."""
    import torch

    from mopd.core.generation import GenerationRequest, SamplingParams
    from mopd.rollout.vllm_async_engine import VLLMStepFront
    from mopd.rollout.vllm_engine import VLLMEngine
    from mopd.train.weight_sync import refresh_engine, release_engine

    with clock("vllm_start"):
        vllm_engine = VLLMEngine(model_dir, gpu_memory_utilization=0.3, max_model_len=2048)
    refresh_engine(vllm_engine, lm, vllm_engine.weight_dtype)          # the trainer's weights, as after a step
    with clock("vllm_rollout"):
        vouts = vllm_engine.generate(prompts)
    res["vllm_rollout_tokens"] = sum(len(c.token_ids) for o in vouts for c in o)

    greedy = [GenerationRequest(p.prompt_ids, SamplingParams(temperature=0.0, max_new_tokens=16)) for p in prompts[:8]]
    front = VLLMStepFront(vllm_engine)
    try:
        with clock("vllm_front"):
            futures = [front.submit(r) for r in greedy]
            fouts = [f.result(timeout=60) for f in futures]
    finally:
        front.close()
    direct = vllm_engine.generate(greedy)
    checks["vLLM step front: every request resolves, as generate's greedy output"] = \
        [[c.token_ids for c in o] for o in fouts] == [[c.token_ids for c in o] for o in direct]

    free_before = torch.cuda.mem_get_info()[0] if cuda else 0
    with clock("vllm_cycle"):
        release_engine(vllm_engine, lm)
        if cuda:
            res["vllm_sleep_freed_gib"] = round((torch.cuda.mem_get_info()[0] - free_before) / 2 ** 30, 3)
        refresh_engine(vllm_engine, lm, vllm_engine.weight_dtype)
    if cuda:
        checks["vLLM level-2 sleep frees device memory"] = res["vllm_sleep_freed_gib"] > 0
    woken = [o[0] for o in vllm_engine.generate(greedy)]
    model = hf_engine.model
    worst = 0.0
    with torch.no_grad():
        for req, c in zip(greedy, woken):
            ids = torch.tensor([list(req.prompt_ids) + list(c.token_ids)], device=next(model.parameters()).device)
            logits = model(ids).logits[0, len(req.prompt_ids) - 1:-1].float()
            ref = torch.log_softmax(logits, -1).gather(1, ids[0, len(req.prompt_ids):, None])[:, 0]
            worst = max(worst, float((ref.cpu() - torch.tensor(c.logprobs)).abs().max()))
    res["vllm_woken_vs_trainer_max_logprob_diff"] = round(worst, 5)
    tol = 5e-2 if cuda else 1e-3                                          # bf16 kernels on a GPU
    checks["woken vLLM's greedy tokens score as the trainer's model scores them"] = worst < tol
    vllm_engine.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny sizes (CI self-check)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--out", default=None, help="write the JSON result here")
    a = p.parse_args(argv)

    import torch

    if not a.dry_run and not torch.cuda.is_available():
        print("FAIL gpu_fsdp_step: no CUDA device (use --dry-run for the CPU self-check)", flush=True)
        return 1
    cuda = torch.cuda.is_available() and not a.dry_run
    if a.dry_run:
        a.hidden, a.layers, a.micro_batch_tokens, a.micro_batches = 64, 2, 256, 2
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    init_single_process_group(cuda)

    from mopd.algo.advantages import role_specs
    from mopd.config import PRESETS  # the preset itself: no omegaconf on the GPU image
    from mopd.core.generation import GenerationRequest, SamplingParams
    from tests.helpers.tiny_model import init_tiny_model
    from mopd_kernels import FusedLinearPolicyLoss, PolicyLossSettings
    from mopd.rollout.hf_engine import HFEngine
    from mopd.train import checkpoint as ckpt
    from mopd.train.model import PackedCausalLM, load_causal_lm, master_dtype, resolve_dtype, shard_model
    from mopd.train.partial_scoring import score_needed, sequences_with_roles
    from mopd.train.weight_sync import refresh_engine, release_engine

    tmp = Path(tempfile.mkdtemp(prefix="mopd_fsdp_step_"))
    model_dir = str(init_tiny_model(tmp / "model", vocab_size=1024, hidden=a.hidden, layers=a.layers,
                                    heads=max(2, a.hidden // 128), ffn=3 * a.hidden, seed=0))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = Clock(sync)
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu", "hidden": a.hidden, "layers": a.layers,
           "torch": torch.__version__}
    checks = {}

    lm, _ = load_causal_lm(model_dir, dtype=master_dtype("auto", device, sharded=True), device=device)
    policy = PackedCausalLM(lm)
    shard_model(lm, device, root=policy)                    # bf16 compute + checkpointing on CUDA
    res["attn"] = lm.config._attn_implementation
    res["params_m"] = sum(x.numel() for x in lm.parameters()) / 1e6
    checks["fp32 masters"] = all(x.dtype == torch.float32 for x in lm.parameters())
    teacher_lm, _ = load_causal_lm(model_dir, dtype=resolve_dtype("auto", device), device=device)
    teacher = PackedCausalLM(teacher_lm.eval().requires_grad_(False))
    engine = HFEngine.from_pretrained(model_dir, device=str(device), prefix_cache_mb=0)
    vocab = lm.config.vocab_size

    # rollout: 16 prompts, 4 samples each
    prompts = [GenerationRequest([5 + (i * 7 + j) % (vocab - 10) for j in range(48)],
                                 SamplingParams(n=4, max_new_tokens=16 if a.dry_run else 128, seed=i))
               for i in range(4 if a.dry_run else 16)]
    with clock("rollout"):
        outs = engine.generate(prompts)
    res["rollout_tokens"] = sum(len(c.token_ids) for o in outs for c in o)
    before = torch.cuda.memory_allocated() if cuda else 0
    with clock("release"):
        release_engine(engine, lm)
    if cuda:
        res["sleep_freed_gib"] = round((before - torch.cuda.memory_allocated()) / 2 ** 30, 3)
        checks["level-2 sleep frees the engine's weights"] = res["sleep_freed_gib"] > 0

    batches = [b.to(device) for b in random_batches(vocab, a.micro_batches, a.micro_batch_tokens, seed=1)]
    n_tok = sum(b.num_tokens for b in batches)
    searcher = [1]
    with torch.no_grad():
        with clock("score_old"):
            for b in batches:
                b.old_logp = policy(b)
        with clock("score_teacher"):
            for b in batches:
                b.teacher_logp = score_needed(teacher, b, searcher)
        full = teacher(batches[0])
    policy.reshard()   # the root stays unsharded after a forward until a backward reshards it
    need = torch.isin(batches[0].seq_ids, sequences_with_roles(batches[0], searcher))
    tol = 2e-2 if cuda else 1e-4
    checks["partial teacher scoring = full where read"] = bool(
        torch.allclose(batches[0].teacher_logp[need], full[need], atol=tol, rtol=0))
    res["teacher_tokens_scored_frac"] = round(float(need.float().mean()), 3)

    loss_fn = FusedLinearPolicyLoss(PolicyLossSettings(role_specs=tuple(role_specs(PRESETS["mopd"]().algo))))
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-5)
    start = {n: x.detach().full_tensor().clone() for n, x in list(lm.named_parameters())[:3]}
    losses = []
    with clock("train"):
        for _ in range(2):
            normalizer = float(sum(b.loss_tokens for b in batches))
            total = 0.0
            for b in batches:
                b.ref_logp = b.teacher_logp
                loss, _ = policy(b, loss_fn, normalizer=normalizer)
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(total)
    res["losses"] = [round(x, 5) for x in losses]
    checks["finite losses"] = all(math.isfinite(x) for x in losses)
    checks["weights moved"] = any(not torch.equal(start[n], x.detach().full_tensor())
                                  for n, x in list(lm.named_parameters())[:3])
    checks["AdamW state fp32"] = all(v.dtype == torch.float32 for st in opt.state.values()
                                     for k, v in st.items() if k in ("exp_avg", "exp_avg_sq"))

    with clock("refresh"):
        refresh_engine(engine, lm, resolve_dtype("auto", device))
    name, param = next(iter(lm.named_parameters()))
    mine = dict(engine.model.named_parameters())[name.replace("_checkpoint_wrapped_module.", "")]
    checks["engine holds the updated weights"] = bool(torch.equal(mine, param.detach().full_tensor().to(mine.dtype)))
    with clock("rollout_after_refresh"):
        outs = engine.generate(prompts[:2])
    checks["engine generates after the refresh"] = all(len(c.token_ids) > 0 for o in outs for c in o)

    with clock("checkpoint_save"):
        path = ckpt.save_checkpoint(tmp / "run", 2, lm, opt, {"note": "gpu_fsdp_step"}, keep=1)
    saved = {n: x.detach().full_tensor().clone() for n, x in lm.named_parameters()}
    with torch.no_grad():
        for x in lm.parameters():
            x.add_(1.0)
    with clock("checkpoint_load"):
        ckpt.load_checkpoint(path, lm, opt)
    checks["checkpoint round trip exact"] = all(torch.equal(saved[n], x.detach().full_tensor())
                                                for n, x in lm.named_parameters())

    if importlib.util.find_spec("vllm") is not None:
        vllm_cycle(model_dir, prompts, engine, lm, cuda, clock, res, checks)
    else:
        res["vllm"] = "not importable: skipped"

    t = clock.times
    res["seconds"] = {k: round(v, 4) for k, v in t.items()}
    res["tokens_per_s"] = {
        "rollout": round(res["rollout_tokens"] / max(t["rollout"], 1e-9), 1),
        "score_old": round(n_tok / max(t["score_old"], 1e-9), 1),
        "score_teacher": round(n_tok / max(t["score_teacher"], 1e-9), 1),
        "train": round(2 * n_tok / max(t["train"], 1e-9), 1),
    }
    if "vllm_rollout" in t:
        res["tokens_per_s"]["vllm_rollout"] = round(res["vllm_rollout_tokens"] / max(t["vllm_rollout"], 1e-9), 1)
    if cuda:
        res["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 3)
    res["checks"] = checks
    print("FSDP_STEP " + json.dumps(res), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    for k, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} fsdp_step: {k}")
    import torch.distributed as dist

    if dist.is_initialized():          # vLLM's engine shutdown destroys the group it ran on
        dist.destroy_process_group()
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
