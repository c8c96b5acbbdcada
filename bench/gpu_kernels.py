"""GPU check of ``mopd_kernels``: compiled Triton kernels against the references, then timings.

Run it through ``bench/gpu_check.sh`` (one command on one H200; this script's share is a 265 s
timeout, and it is sized for well under that: ~100-150 s expected, never yet measured):

1. environment (GPU, torch, triton, liger);
2. correctness: the Triton backend against the naive reference (fused loss: loss, grad_hidden,
   grad_weight, stats; linear_logprobs: scoring pass and gradients) in fp32 and bf16, odd shapes;
3. a small launch-config sweep (BLOCK_V, num_warps; only values ``triton_kernels.launch_config``
   accepts) of both row kernels on one logits chunk of the timing shape: each candidate is checked
   against a torch reference (statistics kernel: logp, entropy, lse; gradient kernel: dlogits by
   autograd through ``log_softmax``) before it is timed, and only a checked one can be picked;
4. correctness at the timing shape, with the picked config applied: the fused loss (Triton and the
   chunked torch path), the scoring pass and the ``linear_logprobs`` backward against
   ``mopd_kernels.reference`` run on the same row blocks as the kernel's chunks (fp32 sums);
5. timings (``triton.testing.do_bench`` medians) at T=16384, H=2560, V=151936 bf16: the fused loss
   fwd+bwd against the floor of its three bare matmuls (logits, grad_hidden, grad_weight), the
   chunked torch path and Liger's fused linear cross entropy (when installed); the no-grad scoring
   pass against one matmul; peak extra memory; a chunk-budget sweep (each budget's loss and
   gradients checked against the same reference before it is timed);
6. PASS/FAIL lines against the targets of docs/architecture.md ("Performance targets") and a JSON
   summary (``--out``).

``--dry-run`` runs the same code on CPU with tiny shapes and the Triton interpreter (timings by
``time.perf_counter``, memory by ``mopd_kernels.memtrack``), so CI keeps the script from rotting.
The exit code is 1 when a correctness check fails (or, with ``--strict``, a target is missed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import traceback

TARGETS = {
    "fused_vs_floor_max": 1.25,
    "scoring_vs_matmul_max": 1.15,
    "extra_memory_gib_max": 1.0,
    "torch_path_vs_fused_min": 1.5,
    "liger_vs_fused_min": 1.5,
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true",
                   help="CPU self-check: tiny shapes, Triton interpreter, no real timings")
    p.add_argument("--out", default=None, help="write the JSON summary here")
    p.add_argument("--shape", default="16384,2560,151936", help="T,H,V of the timing runs")
    p.add_argument("--skip-timing", action="store_true", help="correctness checks only")
    p.add_argument("--strict", action="store_true", help="exit 1 when a performance target is missed")
    p.add_argument("--rep-ms", type=float, default=400.0, help="do_bench repetition time per measurement")
    p.add_argument("--sweep-rep-ms", type=float, default=150.0,
                   help="do_bench repetition time per kernel in the launch-config sweep")
    p.add_argument("--budget-s", type=float, default=215.0,
                   help="skip the optional parts (chunk-budget sweep, reference memory) past this many "
                        "seconds (gpu_check.sh stops the script at 265 s)")
    return p.parse_args(argv)


ARGS = parse_args()
if ARGS.dry_run:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

from mopd_kernels import (  # noqa: E402
    FusedLinearPolicyLoss,
    LossInputs,
    PolicyLossSettings,
    RoleSpec,
    fused_linear_policy_loss,
    linear_logprobs,
    reference_linear_logprobs,
    stats_to_floats,
)
from mopd_kernels import chunked  # noqa: E402
from mopd_kernels.memtrack import TensorMemoryTracker  # noqa: E402
from mopd_kernels.reference import reference_policy_loss  # noqa: E402

LINES = []
FAILED = []
T_START = time.time()
CHECKPOINT = [lambda: None]  # main() sets it to "write the summary so far": a timeout keeps partial results


def checkpoint():
    CHECKPOINT[0]()


def report(ok, what, detail=""):
    tag = "PASS" if ok else "FAIL"
    line = f"{tag} {what}" + (f"  ({detail})" if detail else "")
    print(line, flush=True)
    LINES.append(line)
    if not ok:
        FAILED.append(what)
    return ok


def info(line):
    print(f"INFO {line}", flush=True)
    LINES.append(f"INFO {line}")


def elapsed():
    return time.time() - T_START


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

SPECS = [
    RoleSpec("outcome", entropy_coef=1e-3, kl_coef=1e-2, kl_type="k3", name="leader"),
    RoleSpec("opd", opd_coef=0.01, entropy_coef=1e-3, name="searcher"),
    RoleSpec("outcome", entropy_coef=1e-3, kl_coef=1e-2, kl_type="k1", name="answerer"),
]


def make_inputs(T, H, V, dtype, device, seed=0, ignored_frac=0.2):
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = torch.randn(T, H, generator=g).to(device=device, dtype=dtype)
    weight = (torch.randn(V, H, generator=g) / H ** 0.5 * 4).to(device=device, dtype=dtype)
    targets = torch.randint(0, V, (T,), generator=g).to(device)
    with torch.no_grad():
        logp, _ = linear_logprobs(hidden, weight, targets, backend="reference" if T * V <= 2**28 else "auto")
    old = logp + 0.2 * torch.randn(T, generator=g).to(device)
    roles = torch.randint(0, len(SPECS), (T,), generator=g)
    roles[torch.rand(T, generator=g) < ignored_frac] = -1
    return dict(hidden=hidden, weight=weight, targets=targets, old_logp=old,
                advantages=torch.randn(T, generator=g).to(device), roles=roles.to(device),
                teacher_logp=logp + torch.randn(T, generator=g).to(device),
                ref_logp=logp + 0.1 * torch.randn(T, generator=g).to(device))


def loss_inputs(inp):
    return LossInputs(inp["roles"], inp["old_logp"], inp["advantages"], inp["teacher_logp"], inp["ref_logp"])


def loss_fwd_bwd(inp, backend, **settings):
    h = inp["hidden"].detach().requires_grad_(True)
    w = inp["weight"].detach().requires_grad_(True)
    loss, stats = fused_linear_policy_loss(h, w, inp["targets"], loss_inputs(inp),
                                           PolicyLossSettings(SPECS, backend=backend, **settings))
    loss.backward()
    return loss.detach(), h.grad, w.grad, stats


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


# ---------------------------------------------------------------------------------------------
# 2. Correctness
# ---------------------------------------------------------------------------------------------


def check_correctness(device, shapes, summary):
    tol = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 3e-2)}
    out = []
    for (T, H, V) in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            name = f"T{T} H{H} V{V} {str(dtype).replace('torch.', '')}"
            inp = make_inputs(T, H, V, dtype, device, seed=T + V)
            row = {"shape": [T, H, V], "dtype": str(dtype)}
            try:
                for dual in (None, 3.0):
                    want = loss_fwd_bwd(inp, "reference", dual_clip=dual, temperature=0.9)
                    got = loss_fwd_bwd(inp, "triton", dual_clip=dual, temperature=0.9)
                    e_loss = abs(float(got[0]) - float(want[0])) / max(1e-6, abs(float(want[0])))
                    e_h, e_w = rel(got[1], want[1]), rel(got[2], want[2])
                    fs, fw = stats_to_floats(got[3]), stats_to_floats(want[3])
                    e_s = max(abs(fs[k] - fw[k]) / max(1.0, abs(fw[k]))
                              for k in fw if not k.endswith("clip_frac"))
                    lt, gt = tol[dtype]
                    ok = e_loss <= lt and e_h <= gt and e_w <= gt and e_s <= max(lt, 1e-4)
                    row[f"loss_dual{dual}"] = dict(loss=e_loss, grad_hidden=e_h, grad_weight=e_w, stats=e_s)
                    report(ok, f"fused loss triton == reference [{name}, dual_clip={dual}]",
                           f"loss {e_loss:.1e}, grad_h {e_h:.1e}, grad_w {e_w:.1e}, stats {e_s:.1e}")
                with torch.no_grad():
                    lp, ent = linear_logprobs(inp["hidden"], inp["weight"], inp["targets"], temperature=0.7,
                                              backend="triton")
                    lp_r, ent_r = reference_linear_logprobs(inp["hidden"], inp["weight"], inp["targets"],
                                                            temperature=0.7)
                e_lp = float((lp - lp_r).abs().max())
                e_ent = float((ent - ent_r).abs().max())
                row["scoring"] = dict(logp_abs=e_lp, entropy_abs=e_ent)
                report(e_lp <= 1e-3 and e_ent <= 1e-3, f"scoring pass triton == log_softmax gather [{name}]",
                       f"max |dlogp| {e_lp:.1e}, max |dH| {e_ent:.1e}")
                grads = {}
                a = torch.randn(T, device=device)
                b = torch.randn(T, device=device)
                for be in ("reference", "triton"):
                    h = inp["hidden"].detach().requires_grad_(True)
                    w = inp["weight"].detach().requires_grad_(True)
                    lp, ent = linear_logprobs(h, w, inp["targets"], backend=be)
                    ((a * lp).sum() + (b * ent).sum()).backward()
                    grads[be] = (h.grad, w.grad)
                e_h = rel(grads["triton"][0], grads["reference"][0])
                e_w = rel(grads["triton"][1], grads["reference"][1])
                row["logprobs_grad"] = dict(grad_hidden=e_h, grad_weight=e_w)
                report(max(e_h, e_w) <= tol[dtype][1],
                       f"linear_logprobs backward triton == reference [{name}]",
                       f"grad_h {e_h:.1e}, grad_w {e_w:.1e}")
            except Exception as e:  # a crash is a failed check, and the run goes on
                traceback.print_exc()
                report(False, f"correctness [{name}] raised {type(e).__name__}: {e}")
            out.append(row)
    summary["correctness"] = out


# ---------------------------------------------------------------------------------------------
# 3-4. Timings and memory
# ---------------------------------------------------------------------------------------------


class Timer:
    def __init__(self, device, rep_ms):
        self.device = device
        self.rep_ms = rep_ms

    def __call__(self, fn, grad_to_none=None, rep_ms=None):
        rep_ms = rep_ms or self.rep_ms
        if self.device.type == "cuda":
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=max(25, rep_ms // 5), rep=rep_ms,
                                                 grad_to_none=grad_to_none, return_mode="median"))
        times = []
        for _ in range(1):  # dry run: exercise the code, the number means nothing
            for t in grad_to_none or []:
                t.grad = None
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def peak_extra_bytes(fn, device):
    """Peak memory above what was allocated before ``fn`` (tensors it keeps count)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with TensorMemoryTracker() as mem:
        fn()
    return mem.peak_bytes


SWEEP_CONFIGS = [(4096, 8), (2048, 4), (4096, 4), (8192, 8), (8192, 16), (16384, 16)]
"""(BLOCK_V, num_warps) candidates of the GPU sweep, the default first. Configs that spill registers
on sm_90 in bf16 (e.g. 16384 x 32 warps) are left out: kernels/tests/triton_aot_check.py
``--launch-config B,W`` compiles any of them as the launches get them (8192 x 8 spills 8 bytes in the
fp32 gradient kernel at an odd vocabulary on sm_90, none in bf16, which is what the sweep times)."""


def row_kernel_reference(z, targets, inv_t, seed=0):
    """A torch reference for the two row kernels on one logits chunk ``z`` [C, V] (fp32 maths):
    ``(logp, entropy, lse)`` per row, upstream gradients ``(g_logp, g_H)`` and the dlogits (over
    ``s = z * inv_t``) of ``sum(g_logp logp + g_H H)`` by autograd through ``log_softmax``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    C = z.shape[0]
    g_logp = torch.randn(C, generator=g).to(z.device)
    g_ent = torch.randn(C, generator=g).to(z.device)
    s = (z.float() * inv_t).requires_grad_(True)
    lp_all = torch.log_softmax(s, dim=-1)
    logp = lp_all.gather(1, targets.long().unsqueeze(1)).squeeze(1)
    ent = -(lp_all.exp() * lp_all).sum(dim=-1)
    ((g_logp * logp).sum() + (g_ent * ent).sum()).backward()
    with torch.no_grad():
        lse = torch.logsumexp(s, dim=-1)
    dl = s.grad
    del s, lp_all
    return dict(logp=logp.detach(), entropy=ent.detach(), lse=lse, g_logp=g_logp, g_entropy=g_ent, dlogits=dl)


def check_row_kernels(tk, z, targets, inv_t, ref, label):
    """Both row kernels at the current launch config against ``row_kernel_reference``; True when right."""
    C = z.shape[0]
    out = [torch.empty(C, device=z.device) for _ in range(3)]
    tk.TritonRowPass().stats(z, targets, inv_t, *out)
    e_fwd = max(float((o - ref[k]).abs().max()) for o, k in zip(out, ("logp", "entropy", "lse")))
    dl = tk.TritonRowPass().logprobs_grad(z.clone(), targets, inv_t, ref["lse"], ref["entropy"], ref["g_logp"],
                                          ref["g_entropy"])
    e_bwd = rel(dl.float(), ref["dlogits"])
    ok_fwd = report(e_fwd <= 1e-3, f"statistics kernel == torch [{label}]", f"max |d| {e_fwd:.1e}")
    ok_bwd = report(e_bwd <= 1e-2, f"gradient kernel == torch [{label}]", f"dlogits rel {e_bwd:.1e}")
    return ok_fwd and ok_bwd, {"fwd_max_abs": e_fwd, "bwd_rel": e_bwd}


def sweep_launch_configs(inp, device, timer, summary, sweep_rep_ms):
    """Time both row kernels at each valid candidate config on one chunk of the timing shape, each
    candidate checked first; apply the fastest checked one (fwd + bwd time) to both kernels."""
    from mopd_kernels import triton_kernels as tk

    T, V = inp["hidden"].shape[0], inp["weight"].shape[0]
    C = min(T, 2048)
    z = inp["hidden"][:C] @ inp["weight"].T
    targets = inp["targets"][:C]
    inv_t = 1.0 / 0.7
    ref = row_kernel_reference(z, targets, inv_t)
    zbuf = torch.empty_like(z)
    results, checks = {}, {}
    configs = SWEEP_CONFIGS if device.type == "cuda" else [(1024, 4)]
    for block, warps in configs:
        name = f"{block}x{warps}"
        try:
            tk.check_launch_config(block, warps)  # what launch_config would accept
        except ValueError as e:
            info(f"row kernels {name}: skipped ({e})")
            continue
        if block > triton_next_pow2(V) and (block, warps) != configs[0]:
            continue
        tk.set_launch_config(block, warps)
        try:
            ok, checks[name] = check_row_kernels(tk, z, targets, inv_t, ref, f"BLOCK_V={block} num_warps={warps}")
            if not ok:
                continue  # a wrong config is never timed nor picked
            out = [torch.empty(C, device=device) for _ in range(3)]
            ms_fwd = timer(lambda: tk.TritonRowPass().stats(z, targets, inv_t, *out), rep_ms=sweep_rep_ms)

            def bwd():
                zbuf.copy_(z)  # the kernel overwrites its chunk: a fresh copy each time (timed with it)
                tk.TritonRowPass().logprobs_grad(zbuf, targets, inv_t, ref["lse"], ref["entropy"], ref["g_logp"],
                                                 ref["g_entropy"])

            ms_copy = timer(lambda: zbuf.copy_(z), rep_ms=sweep_rep_ms)
            ms_bwd = max(0.0, timer(bwd, rep_ms=sweep_rep_ms) - ms_copy)
            results[name] = {"fwd_ms": ms_fwd, "bwd_ms": ms_bwd, "total_ms": ms_fwd + ms_bwd}
            gb = C * V * z.element_size() / 1e6
            info(f"row kernels BLOCK_V={block} num_warps={warps} on a [{C}, {V}] chunk: statistics "
                 f"{ms_fwd:.3f} ms ({gb / ms_fwd:.0f} GB/s read), gradient {ms_bwd:.3f} ms")
        except Exception as e:
            info(f"row kernels BLOCK_V={block} num_warps={warps} failed: {type(e).__name__}: {e}")
    best = min(results, key=lambda k: results[k]["total_ms"]) if results else None
    if best:
        block, warps = map(int, best.split("x"))
        tk.set_launch_config(block, warps)  # checked above at this config, per kernel
        info(f"using BLOCK_V={block} num_warps={warps} (checked: statistics max |d| "
             f"{checks[best]['fwd_max_abs']:.1e}, dlogits rel {checks[best]['bwd_rel']:.1e})")
    else:
        tk.set_launch_config(None, None)
        info("no launch config passed its check: back to the defaults")
    summary["launch_sweep_ms"] = results
    summary["launch_sweep_checks"] = checks
    summary["launch_config"] = best


# ---------------------------------------------------------------------------------------------
# Correctness at the timing shape
# ---------------------------------------------------------------------------------------------


def chunk_blocks(n, inp):
    """The row blocks ``[(s, e)]`` the Triton chunk loop makes of ``n`` rows (so that the
    reference's matmuls have the kernel's shapes and give the same logits)."""
    from mopd_kernels.triton_kernels import TritonRowPass

    loop = chunked.ChunkLoop(TritonRowPass(), 1.0)
    C = loop.rows_per_chunk(n, inp["hidden"], inp["weight"].shape[0])
    return [(s, min(n, s + C)) for s in range(0, n, C)]


class TimingReference:
    """``mopd_kernels.reference`` at the timing shape, run on the row blocks of the kernel's chunks
    (never all T x V logits at once), gradients summed in fp32."""

    def __init__(self, inp, settings):
        T = inp["hidden"].shape[0]
        dev = inp["hidden"].device
        H, V = inp["hidden"].shape[1], inp["weight"].shape[0]
        assert bool((inp["roles"] >= 0).all()), "the timing inputs train every row (chunks = row blocks)"
        inputs = loss_inputs(inp)
        # the fused loss: loss, grad_hidden, grad_weight
        self.loss = 0.0
        self.grad_h = torch.zeros(T, H, device=dev)
        self.grad_w = torch.zeros(V, H, device=dev)
        for s, e in chunk_blocks(T, inp):
            h = inp["hidden"][s:e].detach().requires_grad_(True)
            w = inp["weight"].detach().requires_grad_(True)
            loss, _ = reference_policy_loss(h, w, inp["targets"][s:e], inputs.rows(s, e), settings, normalizer=T)
            loss.backward()
            self.loss += float(loss.detach())
            self.grad_h[s:e] = h.grad.float()
            self.grad_w += w.grad.float()
            del h, w, loss
        # linear_logprobs: scoring pass, and the gradients of sum(a logp + b H)
        g = torch.Generator(device="cpu").manual_seed(7)
        self.a = torch.randn(T, generator=g).to(dev) / T
        self.b = torch.randn(T, generator=g).to(dev) / T
        self.logp = torch.empty(T, device=dev)
        self.entropy = torch.empty(T, device=dev)
        self.lp_grad_h = torch.zeros(T, H, device=dev)
        self.lp_grad_w = torch.zeros(V, H, device=dev)
        for s, e in chunk_blocks(T, inp):
            h = inp["hidden"][s:e].detach().requires_grad_(True)
            w = inp["weight"].detach().requires_grad_(True)
            lp, ent = reference_linear_logprobs(h, w, inp["targets"][s:e])
            ((self.a[s:e] * lp).sum() + (self.b[s:e] * ent).sum()).backward()
            self.logp[s:e] = lp.detach()
            self.entropy[s:e] = ent.detach()
            self.lp_grad_h[s:e] = h.grad.float()
            self.lp_grad_w += w.grad.float()
            del h, w, lp, ent


def check_fused_against(ref, got, dtype, label):
    lt, gt = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 3e-2)}[dtype]
    loss, gh, gw = got
    e_loss = abs(float(loss) - ref.loss) / max(1e-6, abs(ref.loss))
    e_h, e_w = rel(gh, ref.grad_h), rel(gw, ref.grad_w)
    report(e_loss <= lt and e_h <= gt and e_w <= gt, f"fused loss == reference [{label}]",
           f"loss {e_loss:.1e}, grad_h {e_h:.1e}, grad_w {e_w:.1e}")
    return dict(loss=e_loss, grad_hidden=e_h, grad_weight=e_w)


def check_timing_shape(inp, settings, ref, summary):
    """The backends and passes that are timed, at the timing shape, with the launch config in use."""
    T, H = inp["hidden"].shape
    V = inp["weight"].shape[0]
    dtype = inp["hidden"].dtype
    name = f"T{T} H{H} V{V} {str(dtype).replace('torch.', '')}"
    out = {"shape": [T, H, V], "dtype": str(dtype)}
    summary["timing_correctness"] = out
    for backend in ("triton", "torch"):
        h = inp["hidden"].detach().requires_grad_(True)
        w = inp["weight"].detach().requires_grad_(True)
        loss, _ = fused_linear_policy_loss(h, w, inp["targets"], loss_inputs(inp),
                                           PolicyLossSettings(settings.role_specs, backend=backend))
        loss.backward()
        out[f"fused_{backend}"] = check_fused_against(ref, (loss.detach(), h.grad, w.grad), dtype,
                                                      f"{backend}, timing shape {name}")
        del h, w, loss
    with torch.no_grad():
        lp, ent = linear_logprobs(inp["hidden"], inp["weight"], inp["targets"], backend="triton")
    d_lp = (lp - ref.logp).abs()
    d_ent = float((ent - ref.entropy).abs().max())
    # the same row blocks give the reference the kernel's logits bit for bit, as a rule; a logit a
    # cuBLAS variant rounds to the neighbouring bf16 value moves its row's log-prob by up to one bf16
    # step of the logit, so a handful of outliers is tolerated, a systematic error is not
    frac = float((d_lp > 1e-3).float().mean())
    ok = frac <= 1e-3 and float(d_lp.max()) <= 0.5 and d_ent <= 1e-3
    out["scoring"] = dict(logp_abs_max=float(d_lp.max()), logp_frac_over_1e3=frac, entropy_abs=d_ent)
    report(ok, f"scoring pass triton == reference [timing shape {name}]",
           f"max |dlogp| {float(d_lp.max()):.1e} ({frac:.1e} of tokens over 1e-3), max |dH| {d_ent:.1e}")
    h = inp["hidden"].detach().requires_grad_(True)
    w = inp["weight"].detach().requires_grad_(True)
    lp, ent = linear_logprobs(h, w, inp["targets"], backend="triton")
    ((ref.a * lp).sum() + (ref.b * ent).sum()).backward()
    e_h, e_w = rel(h.grad, ref.lp_grad_h), rel(w.grad, ref.lp_grad_w)
    out["logprobs_grad"] = dict(grad_hidden=e_h, grad_weight=e_w)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    report(max(e_h, e_w) <= tol, f"linear_logprobs backward triton == reference [timing shape {name}]",
           f"grad_h {e_h:.1e}, grad_w {e_w:.1e}")


def triton_next_pow2(n):
    return 1 << (n - 1).bit_length()


def run_timings(device, T, H, V, timer, summary, args):
    dtype = torch.bfloat16
    info(f"timing shape T={T} H={H} V={V} {dtype}")
    inp = make_inputs(T, H, V, dtype, device, seed=1)
    inp["roles"] = inp["roles"].clamp(min=0)  # every row trained: the same T rows as the floor
    h = inp["hidden"].detach().requires_grad_(True)
    w = inp["weight"].detach().requires_grad_(True)
    sweep_launch_configs(inp, device, timer, summary, args.sweep_rep_ms)
    info(f"launch sweep done at {elapsed():.0f} s")
    checkpoint()
    settings = PolicyLossSettings(SPECS)
    ref = TimingReference(inp, settings)
    check_timing_shape(inp, settings, ref, summary)
    info(f"timing-shape checks done at {elapsed():.0f} s")
    checkpoint()
    res = {}
    summary["timings"] = res  # filled as it goes, saved at each checkpoint

    # the floor: the three matmuls the fused loss needs, same shapes, same run
    buf = {"z": torch.empty(T, V, device=device, dtype=dtype),
           "gh": torch.empty(T, H, device=device, dtype=dtype),
           "gw": torch.empty(V, H, device=device, dtype=dtype)}

    def floor():
        torch.mm(inp["hidden"], inp["weight"].T, out=buf["z"])
        torch.mm(buf["z"], inp["weight"], out=buf["gh"])
        torch.mm(buf["z"].T, inp["hidden"], out=buf["gw"])

    res["floor_3mm_ms"] = timer(floor)
    res["matmul_1_ms"] = timer(lambda: torch.mm(inp["hidden"], inp["weight"].T, out=buf["z"]))
    buf.clear()  # free the [T, V] buffer before the fused runs
    checkpoint()

    inputs = loss_inputs(inp)

    def fused(backend):
        loss_fn = FusedLinearPolicyLoss(PolicyLossSettings(SPECS, backend=backend))

        def fn():
            loss, _ = loss_fn(h, w, inp["targets"], inputs)
            loss.backward()
            return loss.detach()
        return fn

    res["fused_triton_ms"] = timer(fused("triton"), grad_to_none=[h, w])
    checkpoint()
    res["chunked_torch_ms"] = timer(fused("torch"), grad_to_none=[h, w])

    def scoring():
        with torch.no_grad():
            linear_logprobs(inp["hidden"], inp["weight"], inp["targets"], backend="triton")

    res["scoring_triton_ms"] = timer(scoring)
    checkpoint()

    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        lce = LigerFusedLinearCrossEntropyLoss()

        def liger():
            out = lce(w, h, inp["targets"])
            loss = out if isinstance(out, torch.Tensor) else out[0]
            loss.backward()

        if device.type == "cuda":
            res["liger_flce_ms"] = timer(liger, grad_to_none=[h, w])
            info(f"liger {__import__('liger_kernel').__name__} fused linear cross entropy timed "
                 "(CE only: a PPO loss on top would cost more)")
    except ImportError:
        info("liger-kernel not installed: Liger baseline skipped (carry a wheel in .whl/ to include it)")
    except Exception as e:
        info(f"Liger baseline failed: {type(e).__name__}: {e}")

    # memory: extra over inputs, net of the gradients autograd must hand back anyway
    h.grad = w.grad = None
    grads_bytes = (T * H + V * H) * torch.empty((), dtype=dtype).element_size()
    peak = peak_extra_bytes(fused("triton"), device)
    res["fused_peak_extra_gib"] = peak / 2**30
    res["fused_peak_extra_net_of_grads_gib"] = (peak - grads_bytes) / 2**30
    h.grad = w.grad = None
    res["scoring_peak_extra_gib"] = peak_extra_bytes(scoring, device) / 2**30
    checkpoint()
    if elapsed() > args.budget_s:
        info(f"past {args.budget_s:.0f} s: reference memory and the chunk-budget sweep skipped")
        return finish_timings(res)
    if device.type == "cuda" or T * V <= 2**22:
        try:
            res["reference_peak_extra_gib"] = peak_extra_bytes(fused("reference"), device) / 2**30
        except torch.OutOfMemoryError:
            res["reference_peak_extra_gib"] = None
            info("reference path ran out of memory at this shape")
        h.grad = w.grad = None

    # chunk-budget sweep (time and memory of the fused loss)
    sweep, sweep_checks = {}, {}
    summary["chunk_budget_checks"] = sweep_checks
    old_budget = os.environ.get("MOPD_KERNELS_CHUNK_MB")
    for mb in ((256, 1024) if device.type == "cuda" else (1,)):
        if elapsed() > args.budget_s:
            info(f"past {args.budget_s:.0f} s: chunk budget {mb} MiB skipped")
            continue
        os.environ["MOPD_KERNELS_CHUNK_MB"] = str(mb)
        h.grad = w.grad = None
        loss = fused("triton")()
        sweep_checks[mb] = check_fused_against(ref, (loss, h.grad, w.grad), dtype, f"triton, chunk budget {mb} MiB")
        h.grad = w.grad = None
        sweep[mb] = dict(ms=timer(fused("triton"), grad_to_none=[h, w]),
                         peak_extra_gib=peak_extra_bytes(fused("triton"), device) / 2**30)
        h.grad = w.grad = None
        info(f"chunk budget {mb} MiB: {sweep[mb]['ms']:.2f} ms, "
             f"peak extra {sweep[mb]['peak_extra_gib']:.3f} GiB")
    if old_budget is None:
        os.environ.pop("MOPD_KERNELS_CHUNK_MB", None)
    else:
        os.environ["MOPD_KERNELS_CHUNK_MB"] = old_budget
    res["chunk_budget_sweep"] = sweep
    return finish_timings(res)


def finish_timings(res):
    for k, v in res.items():
        if k != "chunk_budget_sweep":
            info(f"{k} = {v if v is None else round(v, 4)}")
    info(f"timings done at {elapsed():.0f} s")
    return res


def judge(res, dry_run, summary):
    ratios = {
        "fused_vs_floor": res["fused_triton_ms"] / res["floor_3mm_ms"],
        "scoring_vs_matmul": res["scoring_triton_ms"] / res["matmul_1_ms"],
        "torch_path_vs_fused": res["chunked_torch_ms"] / res["fused_triton_ms"],
    }
    if "liger_flce_ms" in res:
        ratios["liger_vs_fused"] = res["liger_flce_ms"] / res["fused_triton_ms"]
    summary["ratios"] = ratios
    checks = [
        ("fused loss fwd+bwd within 1.25x of its 3 bare matmuls", ratios["fused_vs_floor"],
         ratios["fused_vs_floor"] <= TARGETS["fused_vs_floor_max"]),
        ("no-grad scoring within 1.15x of one matmul", ratios["scoring_vs_matmul"],
         ratios["scoring_vs_matmul"] <= TARGETS["scoring_vs_matmul_max"]),
        ("extra memory (net of grads) under 1 GiB", res["fused_peak_extra_net_of_grads_gib"],
         res["fused_peak_extra_net_of_grads_gib"] < TARGETS["extra_memory_gib_max"]),
        ("at least 1.5x faster than the chunked torch path", ratios["torch_path_vs_fused"],
         ratios["torch_path_vs_fused"] >= TARGETS["torch_path_vs_fused_min"]),
    ]
    if "liger_vs_fused" in ratios:
        checks.append(("at least 1.5x faster than Liger FLCE (CE only)", ratios["liger_vs_fused"],
                       ratios["liger_vs_fused"] >= TARGETS["liger_vs_fused_min"]))
    targets = {}
    for what, value, ok in checks:
        targets[what] = dict(value=value, met=bool(ok))
        if dry_run:
            info(f"target '{what}': {value:.3f} (dry run: CPU interpreter numbers, not judged)")
        else:
            line = f"{'PASS' if ok else 'FAIL'} target: {what}  ({value:.3f})"
            print(line, flush=True)
            LINES.append(line)
    summary["targets"] = targets
    return all(t["met"] for t in targets.values())


def main():
    args = ARGS
    t_start = time.time()
    if args.dry_run:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("FAIL no CUDA device (use --dry-run for the CPU self-check)", flush=True)
        return 1
    import triton

    summary = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dry_run": args.dry_run,
        "device": (torch.cuda.get_device_name() if device.type == "cuda"
                   else f"cpu ({platform.processor() or platform.machine()})"),
        "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(),
    }
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        summary["liger_kernel"] = version("liger-kernel")
    except Exception:
        summary["liger_kernel"] = None
    info(json.dumps(summary))

    def save(final=False):
        summary["failed_checks"] = FAILED
        summary["lines"] = LINES
        summary["wall_s"] = round(time.time() - t_start, 1)
        summary["complete"] = final
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(summary, f, indent=2, default=str)

    CHECKPOINT[0] = save
    torch.manual_seed(0)
    # dry run: V > the interpreter's BLOCK_V (two online blocks), and V < H
    shapes = [(12, 16, 1100), (5, 40, 33)] if args.dry_run else [(1000, 512, 50257), (333, 256, 32003),
                                                                  (1, 128, 151936)]
    check_correctness(device, shapes, summary)
    checkpoint()
    targets_ok = True
    if not args.skip_timing:
        T, H, V = (8, 32, 1100) if args.dry_run else map(int, args.shape.split(","))
        timer = Timer(device, args.rep_ms)
        try:
            res = run_timings(device, T, H, V, timer, summary, args)
            targets_ok = judge(res, args.dry_run, summary)
        except Exception as e:
            traceback.print_exc()
            report(False, f"timing run raised {type(e).__name__}: {e}")
    ok = not FAILED and (targets_ok or not args.strict)
    summary["ok"] = ok
    save(final=True)
    if args.out:
        print(f"INFO summary written to {args.out}", flush=True)
    print(f"{'PASS' if ok else 'FAIL'} gpu_kernels {'dry run ' if args.dry_run else ''}"
          f"({len(FAILED)} failed check(s), {summary['wall_s']} s)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
