"""The demo's multi-seed summary: claims matched over the seeds by their systems, held on how many,
pooled; each seed's timings and pi_0 check beside them."""

import pytest

from mopd.recipes.tiny_world.seed_summary import summarize_seeds


def _claims(d1, d2, holds1, holds2, n=8):
    def claim(trained, base, d, holds):
        qs = [{"dataset": "a" if i % 2 else "b", "id": f"q{i}", "base": 0.25, "trained": 0.25 + d} for i in range(n)]
        return {"trained": trained, "base": base, "metric": "avg@4", "diff": d, "ci": [d - 0.01, d + 0.01],
                "holds": holds, "questions": qs}
    return [claim("C-MAS + RL", "C-MAS base", d1, holds1), claim("MultiAgent-OPD", "H-MAS base", d2, holds2)]


def test_summarize_seeds_counts_held_claims_and_pools():
    per_seed = {3: {"claims": _claims(0.1, 0.05, True, False), "timings": {"total": 600.0},
                    "pi0_check": {"em": 0.2, "valid": 1.0, "weak": False, "verdict": "x"}},
                4: {"claims": _claims(0.2, 0.15, True, True)}}
    s = summarize_seeds(per_seed, draws=200, seed=0)
    assert s["seeds"] == ["3", "4"]
    c1, c2 = s["claims"]
    assert (c1["held"], c2["held"], c1["seeds"]) == (2, 1, 2)
    assert c1["diff"] == pytest.approx(0.15) and c2["diff"] == pytest.approx(0.10)
    assert c1["ci"][0] == pytest.approx(0.1) and c1["ci"][1] == pytest.approx(0.2) and c1["holds"]
    assert "questions" not in s["per_seed"]["3"]["claims"][0]
    assert s["per_seed"]["3"]["pi0_check"] == {"em": 0.2, "valid": 1.0, "weak": False}
    assert "pi0_check" not in s["per_seed"]["4"]


def test_summarize_seeds_matches_claims_by_systems_and_pools_over_the_seeds_that_have_them():
    """Seed 1 lists the two claims in the other order and adds a third; seed 2 lacks the second.
    Each claim pools over the seeds that evaluated it, in ``order`` first, then as they appear."""
    a = _claims(0.1, 0.3, True, True)
    extra = dict(a[0], trained="MultiAgent-OPD", base="No Searcher supervision", kind="primary", holds=False,
                 questions=[dict(q, trained=q["base"] - 0.05) for q in a[0]["questions"]])
    per_seed = {0: {"claims": a}, 1: {"claims": [a[1], a[0], extra]}, 2: {"claims": [a[0]]}}
    s = summarize_seeds(per_seed, draws=200, seed=0,
                        order=[("MultiAgent-OPD", "No Searcher supervision"), ("C-MAS + RL", "C-MAS base")])
    assert [(c["trained"], c["base"], c["seeds"], c["held"]) for c in s["claims"]] == [
        ("MultiAgent-OPD", "No Searcher supervision", 1, 0), ("C-MAS + RL", "C-MAS base", 3, 3),
        ("MultiAgent-OPD", "H-MAS base", 2, 2)]
    primary, stage1, stage2 = s["claims"]
    assert primary["kind"] == "primary" and primary["diff"] == pytest.approx(-0.05)
    assert primary["verdict"] == "below" and not primary["holds"]
    assert stage1["diff"] == pytest.approx(0.1) and stage2["diff"] == pytest.approx(0.3)
    assert stage1["verdict"] == "above" and "kind" not in stage1       # none given: none invented here
    # per seed, the claims it has, in the summary's order
    assert [c["base"] for c in s["per_seed"]["1"]["claims"]] == ["No Searcher supervision", "C-MAS base", "H-MAS base"]
    assert [c["base"] for c in s["per_seed"]["2"]["claims"]] == ["C-MAS base"]


def test_summarize_seeds_refuses_a_claim_measured_two_ways_or_listed_twice():
    a = _claims(0.1, 0.1, True, True)
    b = [dict(c, metric="avg@8") for c in a]
    with pytest.raises(ValueError, match="avg@4.*avg@8"):
        summarize_seeds({0: {"claims": a}, 1: {"claims": b}}, draws=10, seed=0)
    with pytest.raises(ValueError, match="twice"):
        summarize_seeds({0: {"claims": a + a[:1]}}, draws=10, seed=0)
