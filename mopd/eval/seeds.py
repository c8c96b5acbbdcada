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


def interval_verdict(lo: float, hi: float) -> str:
    """above / below when the whole 95% interval is on one side of 0, else indistinguishable."""
    return "above" if lo > 0 else "below" if hi < 0 else "indistinguishable"


def _question_differences(questions: Sequence[dict]) -> tuple[np.ndarray, np.ndarray, int]:
    """A claim's per-question differences (trained - base), their dataset index and dataset count."""
    datasets = sorted({q["dataset"] for q in questions})
    di = np.array([datasets.index(q["dataset"]) for q in questions])
    return np.array([q["trained"] - q["base"] for q in questions], float), di, len(datasets)


def pooled_by_dataset(per_seed_questions: Sequence[Sequence[dict]], draws: int, seed: int) -> dict:
    """{dataset: {diff, ci, verdict, seeds}}: the same two-level bootstrap as the macro difference,
    on one question type at a time, over the seeds whose claim has questions of that type (where
    a macro difference is nil, this says which question types pull which way)."""
    datasets = sorted({q["dataset"] for qs in per_seed_questions for q in qs})
    out = {}
    for d in datasets:
        rows = [_question_differences([q for q in qs if q["dataset"] == d]) for qs in per_seed_questions
                if any(q["dataset"] == d for q in qs)]
        point, lo, hi = pooled_difference(rows, draws=draws, seed=seed)
        out[d] = {"diff": point, "ci": [lo, hi], "verdict": interval_verdict(lo, hi), "seeds": len(rows)}
    return out


def summarize_seeds(per_seed: Mapping[int | str, dict], draws: int, seed: int,
                    order: Sequence[tuple[str, str]] = ()) -> dict:
    """The multi-seed summary from each seed's ``claims.json`` (with per-question values, see
    e.g. a recipe's report) and optionally its ``timings``, ``pi0_check`` and ``decomposition``
    (copied as they are).

    Claims are matched by their (trained, base) systems, not their position, so seeds whose runs
    evaluated different systems pool what they share: each claim is pooled over the seeds that have
    it (``seeds`` counts them). Claims come in ``order`` (pairs of systems), then those ``order``
    does not name, as they first appear. A claim's kind, label and verdict are kept when present;
    its ``per_dataset`` entry pools each question type alone (:func:`pooled_by_dataset`)."""
    seeds = [str(n) for n in per_seed]
    entries = [per_seed[n] for n in per_seed]
    by_seed, found = [], []
    for n, e in zip(seeds, entries):
        pairs = [(c["trained"], c["base"]) for c in e["claims"]]
        if len(set(pairs)) != len(pairs):
            raise ValueError(f"seed {n}: a claim appears twice in {pairs}")
        by_seed.append(dict(zip(pairs, e["claims"])))
        found += [p for p in pairs if p not in found]
    keys = [k for k in order if k in found] + [k for k in found if k not in order]
    claims = []
    for key in keys:
        have = [(n, b[key]) for n, b in zip(seeds, by_seed) if key in b]
        metrics = {c["metric"] for _, c in have}
        if len(metrics) > 1:
            raise ValueError(f"claim {key[0]} vs {key[1]} is measured as {sorted(metrics)} on different seeds")
        rows = [_question_differences(c["questions"]) for _, c in have]
        point, lo, hi = pooled_difference(rows, draws=draws, seed=seed)
        first = have[0][1]
        claim = {"trained": key[0], "base": key[1]}
        claim.update({k: first[k] for k in ("kind", "label") if k in first})
        claim.update({"metric": first["metric"], "seeds": len(have), "held": sum(bool(c["holds"]) for _, c in have),
                      "diff": point, "ci": [lo, hi], "holds": lo > 0, "verdict": interval_verdict(lo, hi),
                      "per_dataset": pooled_by_dataset([c["questions"] for _, c in have], draws, seed)})
        claims.append(claim)
    fields = ("trained", "base", "kind", "label", "metric", "diff", "ci", "holds", "verdict")
    out_seeds = {}
    for n, e, b in zip(seeds, entries, by_seed):
        row = {"claims": [{k: b[key][k] for k in fields if k in b[key]} for key in keys if key in b]}
        if "timings" in e:
            row["timings"] = e["timings"]
        if "pi0_check" in e:
            chk = e["pi0_check"]
            row["pi0_check"] = {"em": chk["em"], "valid": chk["valid"], "weak": chk["weak"]}
        if "decomposition" in e:
            row["decomposition"] = e["decomposition"]
        out_seeds[n] = row
    return {"seeds": seeds, "draws": draws, "bootstrap_seed": seed, "claims": claims, "per_seed": out_seeds}
