"""What each TRL option of mopd-kernels 0.4 costs in the fused head: forward + backward time and the
extra tensor memory of ``FusedLinearGRPOLoss`` with the option on, against the same loss with it off.

CPU, the default (eager) row pass, fp32; one shape (``--shape B,C,H,V``). Time: the median of
``--repeats`` timed calls after one warm-up, the options taken round robin; memory: one more, untimed call under
``mopd_kernels.memtrack.TensorMemoryTracker`` (the extra tensor bytes the call needed: the chunk, the
gradients, the [n] vectors). The entropy filter is timed as the trainer runs it: the scoring pass of
``linear_logprobs`` (no gradient) for every trained token's entropy, the quantile, then the loss.
Prints a markdown table and the load average before and after (the box is shared).

    .venv/bin/python bench/bench_kernel_options.py --shape 8,128,256,32768
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mopd_kernels import Aggregation, Completions, FusedLinearGRPOLoss, PolicyLossSettings, RoleSpec, linear_logprobs
from mopd_kernels.memtrack import TensorMemoryTracker

OPTIONS = {
    "off (grpo, beta 0.04, entropy_coef 0.01)": {},
    "logit_scale=0.0625 (Cohere)": dict(settings=dict(logit_scale=0.0625)),
    "logit_softcap=30 (Gemma 2)": dict(settings=dict(logit_softcap=30.0)),
    "logit_scale + logit_softcap": dict(settings=dict(logit_scale=2.0, logit_softcap=30.0)),
    "luspo": dict(aggregation="luspo"),
    "vespo": dict(settings=dict(objective="vespo")),
    "off_policy_mask_threshold=0.1": dict(settings=dict(off_policy_threshold=0.1)),
    "top_entropy_quantile=0.2 (scoring pass + loss)": dict(entropy_filter=0.2),
    "for scale: GSPO (importance_sampling=sequence)": dict(settings=dict(importance_sampling="sequence")),
}


def _data(B, C, H, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, C, H, generator=g)
    weight = torch.randn(V, H, generator=g) / H ** 0.5
    targets = torch.randint(0, V, (B, C), generator=g)
    lengths = torch.randint(C // 2, C + 1, (B,), generator=g)
    mask = torch.arange(C).unsqueeze(0) < lengths.unsqueeze(1)
    with torch.no_grad():
        logp, _ = linear_logprobs(hidden.reshape(-1, H), weight, targets.reshape(-1))
    logp = logp.reshape(B, C)
    noise = lambda s: s * torch.randn(B, C, generator=g)  # noqa: E731
    return dict(hidden=hidden, weight=weight, targets=targets, mask=mask, adv=torch.randn(B, generator=g),
                old=logp + noise(0.2), ref=logp + noise(0.2), sampling=logp + noise(0.3))


def _call(d, option):
    settings = PolicyLossSettings([RoleSpec(kl_coef=0.04, entropy_coef=0.01)], clip_low=0.2, clip_high=0.28,
                                  backend="torch", kl_bias_correction=True, **option.get("settings", {}))
    loss_fn = FusedLinearGRPOLoss(settings, Aggregation(option.get("aggregation", "grpo")),
                                  entropy_aggregation=Aggregation("bnpo"))
    hidden = d["hidden"].clone().requires_grad_(True)
    weight = d["weight"].clone().requires_grad_(True)
    high = None
    if "entropy_filter" in option:
        m = d["mask"]
        with torch.no_grad():
            _, ent = linear_logprobs(hidden.detach()[m], weight.detach(), d["targets"][m])
        threshold = torch.quantile(ent, 1 - option["entropy_filter"])
        high = torch.zeros_like(m).masked_scatter(m, ent >= threshold)
    completions = Completions(d["targets"], d["mask"], d["adv"], old_logp=d["old"], ref_logp=d["ref"],
                              sampling_logp=d["sampling"], entropy_filter=high)
    loss, _ = loss_fn(hidden, weight, completions)
    loss.backward()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8,128,256,32768", help="B,C,H,V")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    B, C, H, V = (int(x) for x in args.shape.split(","))
    torch.set_num_threads(args.threads)
    d = _data(B, C, H, V)
    load_before = open("/proc/loadavg").read().split()[:3]
    times = {name: [] for name in OPTIONS}
    peaks = {}
    for name, option in OPTIONS.items():
        _call(d, option)  # warm-up
        with TensorMemoryTracker() as mem:
            _call(d, option)
        peaks[name] = mem.peak_bytes
    for _ in range(args.repeats):  # round robin: a load spike on a shared box hits every option alike
        for name, option in OPTIONS.items():
            t0 = time.perf_counter()
            _call(d, option)
            times[name].append(time.perf_counter() - t0)
    rows = [(name, statistics.median(times[name]), peaks[name]) for name in OPTIONS]
    load_after = open("/proc/loadavg").read().split()[:3]
    base_t, base_m = rows[0][1], rows[0][2]
    print(f"shape B={B} C={C} H={H} V={V} fp32, {int(d['mask'].sum())} trained tokens, {args.threads} threads, "
          f"median of {args.repeats}; load average {' '.join(load_before)} -> {' '.join(load_after)}")
    print("| option | fwd+bwd (s) | vs off | extra tensor memory (MiB) | vs off |")
    print("|---|---|---|---|---|")
    for name, t, m in rows:
        print(f"| {name} | {t:.3f} | {t / base_t:.2f}x | {m / 2**20:.1f} | {m / base_m:.2f}x |")


if __name__ == "__main__":
    main()
