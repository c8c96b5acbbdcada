"""The weak-pi_0 verdict and the demo's world settings."""

import pytest

from mopd.data.policy_check import assess_pi0
from mopd.data.tinyworld import QUICK_WORLD, WorldSettings, parse_world_settings


def _wf(em, valid):
    return {"em": em, "answer_valid": valid, "invalid_calls": 0.0, "searches": 1.0}


def test_usable_pi0():
    r = assess_pi0({"cmas": _wf(0.2, 1.0), "hmas": _wf(0.16, 0.99)}, min_em=0.15, min_valid=0.9)
    assert not r["weak"] and r["em"] == pytest.approx(0.18) and r["valid"] == 0.99 and r["reasons"] == []
    assert "usable" in r["verdict"]


@pytest.mark.parametrize("cmas,hmas,reason", [
    (_wf(0.10, 1.0), _wf(0.12, 1.0), "dev EM 0.110"),          # mean EM below
    (_wf(0.40, 1.0), _wf(0.30, 0.5), "valid 0.500"),            # one workflow's format broken
])
def test_weak_pi0_is_flagged_with_the_reason(cmas, hmas, reason):
    r = assess_pi0({"cmas": cmas, "hmas": hmas}, min_em=0.15, min_valid=0.9)
    assert r["weak"] and any(reason in x for x in r["reasons"]) and "WEAK" in r["verdict"]


def test_assess_needs_a_workflow():
    with pytest.raises(ValueError):
        assess_pi0({}, min_em=0.1, min_valid=0.9)


def test_world_settings_from_key_values():
    s = parse_world_settings(["test_per_dataset=100", "bands=400", "index_kind=bm25"], seed=7)
    assert (s.seed, s.test_per_dataset, s.bands, s.index_kind, s.towns) == (7, 100, 400, "bm25", WorldSettings().towns)
    q = parse_world_settings(["dev_per_dataset=3"], seed=1, quick=True)
    assert q.bands == QUICK_WORLD["bands"] and q.dev_per_dataset == 3
    for bad in (["seed=3"], ["nope=1"], ["bands"], ["bands=many"]):
        with pytest.raises(ValueError):
            parse_world_settings(bad)
