"""Claims over several seeds: on how many seeds a claim holds, and its pooled effect with a
two-level bootstrap (seeds, then questions).

A seed is a whole new world, pi_0 and training run, so seeds vary far more than questions within a
seed; an interval that resampled questions alone would ignore that. Each draw picks S seeds with
replacement, and for each pick resamples that seed's questions within each dataset (the paired
question bootstrap of :mod:`mopd.eval.bootstrap`, a fresh resample for every pick, also when a
seed is picked twice); the draw's value is the mean over the S picks of the picked seed's macro
avg@K difference. The point estimate is the mean over seeds of each seed's macro difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mopd.eval.bootstrap import dataset_draws, percentile_interval


def macro_difference(diffs: np.ndarray, dataset_index: np.ndarray, n_datasets: int) -> float:
    """Dataset-macro mean of per-question differences (datasets weighted equally)."""
    return float(np.mean([diffs[dataset_index == d].mean() for d in range(n_datasets)]))


def pooled_difference(per_seed: Sequence[tuple[np.ndarray, np.ndarray, int]], draws: int, seed: int
                      ) -> tuple[float, float, float]:
    """(point, lo, hi) of the mean over seeds of the macro difference; ``per_seed`` holds, per seed,
    the per-question differences [Q], their dataset index [Q] and the number of datasets."""
    s = len(per_seed)
    if s == 0:
        raise ValueError("no seeds to pool")
    point = float(np.mean([macro_difference(v, di, nd) for v, di, nd in per_seed]))
    streams = np.random.SeedSequence(seed).spawn(s + 1)
    # [s, draws, s]: seed j's macro difference under an independent question resample for every
    # (draw, pick) cell, so a seed picked twice in one draw gets two resamples
    macro = np.empty((s, draws, s))
    for j, (v, di, nd) in enumerate(per_seed):
        sub = int(streams[j].generate_state(1)[0])
        per_d = dataset_draws(np.asarray(v, float)[None, :], np.asarray(di), nd, draws=draws * s, seed=sub)
        macro[j] = per_d[:, :, 0].mean(1).reshape(draws, s)
    picks = np.random.default_rng(streams[s]).integers(0, s, size=(draws, s))
    pooled = macro[picks, np.arange(draws)[:, None], np.arange(s)[None, :]].mean(1)
    lo, hi = percentile_interval(pooled)
    return point, float(lo), float(hi)


def summarize_seeds(per_seed: Mapping[int | str, dict], draws: int, seed: int) -> dict:
    """The multi-seed summary from each seed's ``claims.json`` (with per-question values, see
    ``mopd.demo_report.check_claims``) and optionally its ``timings`` and ``pi0_check``."""
    seeds = [str(n) for n in per_seed]
    entries = [per_seed[n] for n in per_seed]
    names = [(c["trained"], c["base"]) for c in entries[0]["claims"]]
    claims = []
    for ci, (trained, base) in enumerate(names):
        rows = []
        for n, e in zip(seeds, entries):
            c = e["claims"][ci]
            if (c["trained"], c["base"]) != (trained, base):
                raise ValueError(f"seed {n}: claim {ci} is {c['trained']} vs {c['base']}, expected {trained} vs {base}")
            qs = c["questions"]
            datasets = sorted({q["dataset"] for q in qs})
            di = np.array([datasets.index(q["dataset"]) for q in qs])
            rows.append((np.array([q["trained"] - q["base"] for q in qs]), di, len(datasets)))
        point, lo, hi = pooled_difference(rows, draws=draws, seed=seed)
        held = sum(bool(e["claims"][ci]["holds"]) for e in entries)
        claims.append({"trained": trained, "base": base, "metric": entries[0]["claims"][ci]["metric"],
                       "seeds": len(seeds), "held": held, "diff": point, "ci": [lo, hi], "holds": lo > 0})
    out_seeds = {}
    for n, e in zip(seeds, entries):
        row = {"claims": [{k: c[k] for k in ("trained", "base", "metric", "diff", "ci", "holds")} for c in e["claims"]]}
        if "timings" in e:
            row["timings"] = e["timings"]
        if "pi0_check" in e:
            chk = e["pi0_check"]
            row["pi0_check"] = {"em": chk["em"], "valid": chk["valid"], "weak": chk["weak"]}
        out_seeds[n] = row
    return {"seeds": seeds, "draws": draws, "bootstrap_seed": seed, "claims": claims, "per_seed": out_seeds}
