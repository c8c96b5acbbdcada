"""One command to compare the fused GRPO loss with the other lm-head losses on your shapes.

    python -m mopd_kernels.bench                                # the default shapes, all baselines found
    python -m mopd_kernels.bench --shape 16384,2048,151936 --dtype bfloat16 --threads 8 --rounds 5
    python -m mopd_kernels.bench --baselines trl --eager --out results.json

What is timed: one **forward + backward** of the same GRPO loss on the same micro-batch, by each of

- ``ours``: ``mopd_kernels.FusedLinearGRPOLoss`` (loss and gradients in one chunked pass over the
  vocabulary, no ``[T, V]`` logits). On CPU its row pass is compiled by ``torch.compile``
  (``--compiled``, the default here, as a trainer runs it) or the eager torch one (``--eager``, the
  library's default); see ``compiled_rows``.
- ``liger``: ``liger_kernel.chunked_loss.LigerFusedLinearGRPOLoss`` (one sequence per chunk; its
  loss maths compiled, as Liger's default, or eager with ``--liger-eager``).
- ``trl``: TRL's chunked lm head, ``trl.kernels.ChunkedLogProbFunction`` (what
  ``trl.trainer.utils.add_fused_lm_head`` runs inside GRPOTrainer: log-probs and entropies tile by
  tile, recomputed in the backward; on a device without Triton it scores every position, as TRL
  does there), followed by GRPOTrainer's loss formula on the ``[B, S]`` log-probs.
- ``naive``: full logits ``hidden @ W^T`` in fp32, ``log_softmax``, gather, the same formula, autograd.

The loss (all four): TRL's ``loss_type="dapo"`` (token mean over the micro-batch's completion tokens)
of the clipped surrogate ``-min(r A, clip(r, 1 - 0.2, 1 + 0.28) A)`` with per-sequence advantages,
plus ``beta = 0.04`` times the k3 KL to reference log-probs (no bias correction, no entropy bonus:
Liger has none). A shape ``T,H,V`` is ``T`` completion positions as ``B = T / --seq-len`` sequences
(default 512), each of a random length between half and all of its positions (the rest is padding,
masked); hidden states ``randn``, weight ``randn / sqrt(H) * 4``, old and reference log-probs the
model's own plus 0.1 noise (so ratios fall on both sides of the clip). Liger needs liger-kernel, TRL's
needs trl; a baseline whose package is missing is skipped with one line.

How it runs: per shape and thread count, one fresh process makes one untimed call of every variant
(it compiles what compiles, and its loss and gradients are compared with ours: the "max rel. diff"
columns are ``max |x - ours| / max |ours|`` for the loss, ``grad_hidden`` and ``grad_weight``), then
``--rounds`` timed calls of each, the variants alternating (the order rotates each round), so that
load from other processes hits all of them alike; the table shows medians.

Peak memory (``--memory``):

- ``rss`` (default): each variant in its own fresh process, after one warm-up call at the shape:
  the high-water mark of the process's resident memory during one call (``/proc/self/clear_refs``
  then ``VmHWM``) minus its RSS before, with glibc's mmap threshold at 128 KiB so that freed tensors
  leave RSS at once. It counts everything the call allocates (tensors, autograd's saved state,
  compiled code, BLAS scratch), including the returned gradients. Linux only; on a GPU the peak of
  ``torch.cuda.max_memory_allocated`` over the call instead.
- ``tensors``: ``mopd_kernels.memtrack.TensorMemoryTracker``, the peak of live tensor bytes made
  during the call, in the timing process (under its dispatch mode our row pass and Liger's loss
  maths run uncompiled, as the eager code they compile).
- ``none``.

Output: a markdown table, one row per shape, thread count and variant: median time (ms) and its
ratio to ours (< 1: faster than ours), peak memory (MiB) and its ratio to ours, the max relative
differences, the load average (``os.getloadavg()``, 1 minute) while it ran. ``--out FILE.json``
writes every round.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import List, Optional, Tuple

import torch

from mopd_kernels import (Aggregation, Completions, FusedLinearGRPOLoss, PolicyLossSettings, RoleSpec,
                          linear_logprobs)
from mopd_kernels import __file__ as pkg_file
from mopd_kernels.compiled_rows import set_compiled_cpu_rows
from mopd_kernels.memtrack import TensorMemoryTracker

DEFAULT_SHAPES = [(4096, 512, 32768), (8192, 256, 50257)]
"""bench/bench_loss_floor.py's ``base`` and ``large`` shapes."""
VARIANTS = ("ours", "liger", "trl", "naive")
BASELINE_PACKAGES = {"liger": ("liger_kernel", "liger-kernel"), "trl": ("trl", "trl")}
BETA = 0.04
EPS_LOW, EPS_HIGH = 0.2, 0.28
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---------------------------------------------------------------------------------------------
# Inputs and the four variants
# ---------------------------------------------------------------------------------------------


def batch_shape(T: int, seq_len: int) -> Tuple[int, int]:
    """``(B, S)``: ``T`` positions as ``B`` sequences of ``S`` (``B * S`` may round ``T`` down)."""
    B = max(1, round(T / seq_len))
    return B, max(1, T // B)


def make_inputs(T: int, H: int, V: int, dtype: torch.dtype, device: torch.device, seq_len: int,
                temperature: float, seed: int = 0) -> dict:
    B, S = batch_shape(T, seq_len)
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, S, H, generator=g)
    weight = torch.randn(V, H, generator=g) / H ** 0.5 * 4
    targets = torch.randint(0, V, (B, S), generator=g)
    lengths = torch.randint(max(1, S // 2), S + 1, (B,), generator=g)
    mask = torch.arange(S).unsqueeze(0) < lengths.unsqueeze(1)
    advantages = torch.randn(B, generator=g)
    noise_old, noise_ref = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g)
    hidden, weight = hidden.to(device, dtype), weight.to(device, dtype)
    targets, mask, advantages = targets.to(device), mask.to(device), advantages.to(device)
    with torch.no_grad():
        logp, _ = linear_logprobs(hidden.reshape(B * S, H), weight, targets.reshape(-1), temperature=temperature,
                                  with_entropy=False)
    logp = logp.reshape(B, S)
    old = (logp + 0.1 * noise_old.to(device)) * mask
    ref = (logp + 0.1 * noise_ref.to(device)) * mask
    return dict(hidden=hidden, weight=weight, targets=targets, mask=mask, advantages=advantages, old=old, ref=ref,
                temperature=temperature)


def trl_grpo_loss(logp, mask, advantages, old, ref):
    """GRPOTrainer._compute_loss (TRL 1.16) for loss_type="dapo", token-level ratios, beta > 0 with
    ``use_bias_correction_kl=False``, one process, no gradient accumulation."""
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - EPS_LOW, 1 + EPS_HIGH)
    a = advantages.unsqueeze(1)
    per_token_loss = -torch.min(coef_1 * a, coef_2 * a)
    per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
    per_token_loss = per_token_loss + BETA * per_token_kl
    m = mask.to(per_token_loss.dtype)
    return (per_token_loss * m).sum() / m.sum().clamp(min=1.0)


def _leaves(inp):
    h = inp["hidden"].detach().clone().requires_grad_(True)
    w = inp["weight"].detach().clone().requires_grad_(True)
    return h, w


def variant_ours(inp, liger_compiled):
    h, w = _leaves(inp)
    settings = PolicyLossSettings([RoleSpec(kl_coef=BETA, kl_type="k3")], clip_low=EPS_LOW, clip_high=EPS_HIGH,
                                  temperature=inp["temperature"])
    loss_fn = FusedLinearGRPOLoss(settings, Aggregation("token-mean"))
    completions = Completions(inp["targets"], inp["mask"], inp["advantages"], old_logp=inp["old"],
                              ref_logp=inp["ref"])

    def call():
        loss, _ = loss_fn(h, w, completions)
        loss.backward()
        return loss
    return call, h, w


def variant_liger(inp, liger_compiled):
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    h, w = _leaves(inp)
    liger = LigerFusedLinearGRPOLoss(beta=BETA, compiled=liger_compiled, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
                                     loss_type="dapo", temperature=inp["temperature"])
    mask = inp["mask"].long()

    def call():
        loss, _ = liger(h, w, inp["targets"], mask, inp["advantages"], ref_per_token_logps=inp["ref"],
                        old_per_token_logps=inp["old"])
        loss.backward()
        return loss
    return call, h, w


def variant_trl(inp, liger_compiled):
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction, _use_triton

    try:
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE as chunk
    except ImportError:
        chunk = 32768
    h, w = _leaves(inp)
    B, S, H = h.shape
    mask = inp["mask"]
    compact = _use_triton(h.device)   # add_fused_lm_head: only the labelled rows on Triton devices
    labels = inp["targets"].masked_fill(~mask, -100)

    def call():
        # GRPOTrainer asks its fused head for log-probs and entropies (the entropy metric)
        if compact:
            logp_rows, _, _, _, _ = ChunkedLogProbFunction.apply(h[mask], w, None, labels[mask], inp["temperature"],
                                                                  chunk, None, 1.0, ("log_probs", "entropy"))
            logp = logp_rows.new_zeros(mask.shape).masked_scatter(mask, logp_rows)
        else:
            logp_rows, _, _, _, _ = ChunkedLogProbFunction.apply(h.reshape(B * S, H), w, None,
                                                                  labels.clamp(min=0).reshape(-1), inp["temperature"],
                                                                  chunk, None, 1.0, ("log_probs", "entropy"))
            logp = logp_rows.view(B, S).masked_fill(~mask, 0)
        loss = trl_grpo_loss(logp, mask, inp["advantages"], inp["old"], inp["ref"])
        loss.backward()
        return loss
    return call, h, w


def variant_naive(inp, liger_compiled):
    h, w = _leaves(inp)

    def call():
        logits = (h @ w.T).float() / inp["temperature"]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, inp["targets"].unsqueeze(-1)).squeeze(-1)
        loss = trl_grpo_loss(logp, inp["mask"], inp["advantages"], inp["old"], inp["ref"])
        loss.backward()
        return loss
    return call, h, w


VARIANT_FNS = {"ours": variant_ours, "liger": variant_liger, "trl": variant_trl, "naive": variant_naive}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# Child processes
# ---------------------------------------------------------------------------------------------


def _setup(a) -> Tuple[torch.device, dict]:
    torch.set_num_threads(a.threads_one)
    set_compiled_cpu_rows(a.compiled)
    device = torch.device(a.device)
    T, H, V = a.shape_one
    return device, make_inputs(T, H, V, DTYPES[a.dtype], device, a.seq_len, a.temperature)


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double(), ref.detach().double()
    return float((x - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


def child_time(a) -> dict:
    """Check every variant against ours (first, untimed call), then alternate timed rounds."""
    device, inp = _setup(a)
    calls, checks, first = {}, {}, {}
    for name in a.variants:
        call, h, w = VARIANT_FNS[name](inp, a.liger_compiled)
        t0 = time.perf_counter()
        loss = call()
        _sync(device)
        first[name] = time.perf_counter() - t0
        got = (loss.detach().clone(), h.grad.detach().clone(), w.grad.detach().clone())
        if name == "ours":
            want = got
        else:
            checks[name] = dict(loss=_rel(got[0], want[0]), grad_hidden=_rel(got[1], want[1]),
                                grad_weight=_rel(got[2], want[2]))
        h.grad = w.grad = None
        calls[name] = (call, h, w)
        del got, loss
    times = {name: [] for name in a.variants}
    loads = []
    names = list(a.variants)
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            call, h, w = calls[name]
            h.grad = w.grad = None
            gc.collect()
            _sync(device)
            t0 = time.perf_counter()
            call()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
            h.grad = w.grad = None
        loads.append(os.getloadavg()[0])
    peaks = {}
    if a.memory == "tensors":
        for name in a.variants:
            call, h, w = calls[name]
            gc.collect()
            with TensorMemoryTracker() as mem:
                call()
            peaks[name] = mem.peak_bytes
            h.grad = w.grad = None
    return dict(times=times, first_call=first, checks=checks, peaks=peaks, loads=loads)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child_rss(a) -> dict:
    """One variant's peak memory over one call, after a warm-up call, in this fresh process."""
    device, inp = _setup(a)
    name = a.variants[0]
    call, h, w = VARIANT_FNS[name](inp, a.liger_compiled)
    call()
    h.grad = w.grad = None
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        call()
        torch.cuda.synchronize()
        return dict(peak=torch.cuda.max_memory_allocated() - base, measure="cuda max_memory_allocated")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")   # reset VmHWM to the current RSS
    base = _status_kib("VmRSS")
    call()
    return dict(peak=(_status_kib("VmHWM") - base) * 1024, base=base * 1024, measure="peak RSS")


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def _child_cmd(a, kind: str, shape, threads: int, variants: List[str]) -> List[str]:
    """``kind`` "time": ours and the baselines ``variants``; "rss": the one variant ``variants[0]``."""
    which = ["--baselines", ",".join(variants)] if kind == "time" else ["--baselines", "", "--variant", variants[0]]
    cmd = [sys.executable, "-m", "mopd_kernels.bench", "--child", kind, "--shape", ",".join(map(str, shape)),
           "--threads", str(threads), "--dtype", a.dtype, "--rounds", str(a.rounds), *which, "--memory", a.memory, "--seq-len", str(a.seq_len), "--temperature",
           str(a.temperature), "--device", a.device, "--compiled" if a.compiled else "--eager"]
    if not a.liger_compiled:
        cmd.append("--liger-eager")
    return cmd


def _run_child(cmd, env=None) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def available_variants(asked: List[str]) -> List[str]:
    out = ["ours"]
    for name in asked:
        if name in BASELINE_PACKAGES:
            module, dist = BASELINE_PACKAGES[name]
            if importlib.util.find_spec(module) is None:
                print(f"{name}: skipped ({dist} is not installed; pip install {dist})", flush=True)
                continue
        out.append(name)
    return out


def _fmt_mib(b: Optional[float]) -> str:
    return "-" if b is None else f"{b / 2**20:.0f} MiB"


def print_table(results: List[dict], memory: str) -> None:
    measure = {"rss": "peak RSS (fresh process)", "tensors": "peak tensor bytes (TensorMemoryTracker)",
               "none": "not measured"}[memory]
    print(f"\nmemory: {measure}; time: median of the timed rounds; ratios are variant / ours; "
          "max rel. diff: max |x - ours| / max |ours|\n")
    print("| T, H, V | dtype | threads | variant | time | time / ours | peak memory | memory / ours | "
          "max rel. diff (loss, grad_h, grad_W) | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        med = {k: statistics.median(v) for k, v in r["times"].items()}
        for name in r["times"]:
            peak, ours_peak = r["peaks"].get(name), r["peaks"].get("ours")
            c = r["checks"].get(name)
            diff = "-" if c is None else f"{c['loss']:.1e}, {c['grad_hidden']:.1e}, {c['grad_weight']:.1e}"
            mem_ratio = f"{peak / ours_peak:.2f}x" if peak is not None and ours_peak else "-"
            print(f"| {', '.join(map(str, r['shape']))} | {r['dtype']} | {r['threads']} | {name} | "
                  f"{med[name] * 1e3:.0f} ms | {med[name] / med['ours']:.2f}x | {_fmt_mib(peak)} | {mem_ratio} | "
                  f"{diff} | {min(r['loads']):.1f}-{max(r['loads']):.1f} |", flush=True)


def _parse_shape(s: str) -> Tuple[int, int, int]:
    try:
        T, H, V = (int(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {s!r}: want T,H,V (three integers)")
    return T, H, V


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m mopd_kernels.bench",
                                description="time and peak memory of the fused GRPO loss (forward + backward) "
                                            "against Liger's, TRL's chunked lm head and naive logits")
    p.add_argument("--shape", action="append", type=_parse_shape,
                   help="T,H,V (repeatable); default: 4096,512,32768 and 8192,256,50257")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--threads", default=str(torch.get_num_threads()),
                   help="torch threads, comma-separated for several runs (default: torch's, here %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="timed calls of each variant (default 3)")
    p.add_argument("--baselines", default="liger,trl,naive", help="any of liger,trl,naive (comma-separated)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--compiled", dest="compiled", action="store_true", default=True,
                   help="ours with the compiled CPU row pass (default: a long job's setting)")
    g.add_argument("--eager", dest="compiled", action="store_false", help="ours with the eager CPU row pass")
    p.add_argument("--liger-eager", dest="liger_compiled", action="store_false", default=True,
                   help="Liger's loss maths uncompiled (compiled=False)")
    p.add_argument("--memory", choices=["rss", "tensors", "none"], default="rss")
    p.add_argument("--seq-len", type=int, default=512, help="positions per sequence (default 512)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", help="write all results as JSON here")
    p.add_argument("--child", choices=["time", "rss"], help=argparse.SUPPRESS)
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    shapes = a.shape or DEFAULT_SHAPES
    asked = [b for b in a.baselines.split(",") if b]
    unknown = [b for b in asked if b not in VARIANTS[1:]]
    if unknown:
        p.error(f"--baselines: unknown {unknown}; choose from liger,trl,naive")
    threads = [int(x) for x in str(a.threads).split(",") if x]
    if a.child:
        a.shape_one, a.threads_one = shapes[0], threads[0]
        a.variants = ["ours"] + asked if a.child == "time" else [a.variant]
        result = child_time(a) if a.child == "time" else child_rss(a)
        print("RESULT " + json.dumps(result), flush=True)
        return
    if a.memory == "rss" and a.device == "cpu" and not os.path.exists("/proc/self/clear_refs"):
        print("memory: /proc/self/clear_refs is missing (not Linux?): using --memory tensors", flush=True)
        a.memory = "tensors"
    variants = available_variants(asked)

    header = dict(torch=torch.__version__, device=a.device, cpu=platform.processor() or platform.machine(),
                  cores=os.cpu_count(), dtype=a.dtype, rounds=a.rounds,
                  ours="compiled CPU row pass" if a.compiled else "eager CPU row pass",
                  liger="compiled loss maths" if a.liger_compiled else "eager", memory=a.memory,
                  started=time.strftime("%Y-%m-%d %H:%M:%S %Z"), load_at_start=os.getloadavg(),
                  mopd_kernels=os.path.dirname(pkg_file))
    print("mopd_kernels.bench: " + ", ".join(f"{k} {v}" for k, v in header.items()), flush=True)
    results = []
    rss_env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    for shape in shapes:
        for n in threads:
            B, S = batch_shape(shape[0], a.seq_len)
            print(f"  {shape} ({B} x {S} positions), {n} threads: timing {', '.join(variants)} ...", flush=True)
            r = _run_child(_child_cmd(a, "time", shape, n, variants[1:]))
            if a.memory == "rss":
                r["peaks"] = {}
                for name in variants:
                    m = _run_child(_child_cmd(a, "rss", shape, n, [name]), env=rss_env)
                    r["peaks"][name] = m["peak"]
            r.update(shape=list(shape), threads=n, dtype=a.dtype, batch=[B, S])
            for name, c in r["checks"].items():
                print(f"    {name} vs ours: max rel. diff loss {c['loss']:.1e}, grad_hidden {c['grad_hidden']:.1e}, "
                      f"grad_weight {c['grad_weight']:.1e}", flush=True)
            print("    median: " + ", ".join(f"{k} {statistics.median(v) * 1e3:.0f} ms" for k, v in r["times"].items())
                  + (", peak: " + ", ".join(f"{k} {_fmt_mib(v)}" for k, v in r["peaks"].items()) if r["peaks"] else ""),
                  flush=True)
            results.append(r)
    print_table(results, a.memory)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(header=header, results=results), f, indent=1)
        print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
