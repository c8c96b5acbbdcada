"""The demo's multi-seed summary (``summary.json``, from which docs/demo.md's seed tables are
rendered): each claim matched over the seeds by its systems, held on how many, and pooled with the
core's two-level bootstrap (:mod:`mopd.eval.seeds`); each seed's timings and pi_0 check beside it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mopd.eval.seeds import interval_verdict, pooled_by_dataset, pooled_difference, question_differences


def summarize_seeds(per_seed: Mapping[int | str, dict], draws: int, seed: int,
                    order: Sequence[tuple[str, str]] = ()) -> dict:
    """The multi-seed summary from each seed's ``claims.json`` (with per-question values, see
    :mod:`.report`) and optionally its ``timings``, ``pi0_check`` (its em, valid and weak) and
    ``decomposition`` (copied as they are).

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
        rows = [question_differences(c["questions"]) for _, c in have]
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
