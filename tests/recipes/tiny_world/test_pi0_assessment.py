"""The weak-pi_0 verdict and the demo's world settings."""

import pytest

from mopd.recipes.tiny_world.policy_check import WeakPi0, assess_pi0
from mopd.recipes.tiny_world.world import QUICK_WORLD, WorldSettings, parse_world_settings
from mopd.recipes.tiny_world.warmstart import parse_pi0_settings

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # tiny models: one thread is fast and steady


def _wf(em, valid):
    return {"em": em, "answer_valid": valid, "invalid_calls": 0.0, "searches": 1.0}


def test_usable_pi0():
    r = assess_pi0({"cmas": _wf(0.2, 1.0), "hmas": _wf(0.16, 0.99)}, WeakPi0(em=0.15, valid=0.9))
    assert not r["weak"] and r["em"] == pytest.approx(0.18) and r["valid"] == 0.99 and r["reasons"] == []
    assert "usable" in r["verdict"]


@pytest.mark.parametrize("cmas,hmas,reason", [
    (_wf(0.10, 1.0), _wf(0.12, 1.0), "dev EM 0.110"),          # mean EM below
    (_wf(0.40, 1.0), _wf(0.30, 0.5), "valid 0.500"),            # one workflow's format broken
])
def test_weak_pi0_is_flagged_with_the_reason(cmas, hmas, reason):
    r = assess_pi0({"cmas": cmas, "hmas": hmas}, WeakPi0(em=0.15, valid=0.9))
    assert r["weak"] and any(reason in x for x in r["reasons"]) and "WEAK" in r["verdict"]


def test_assess_needs_a_workflow():
    with pytest.raises(ValueError):
        assess_pi0({})


def test_thresholds_are_one_checked_value():
    # the same outputs, judged by a stricter bar, are weak for the reason the bar names
    usable = {"cmas": _wf(0.45, 0.95), "hmas": _wf(0.41, 0.93)}
    assert not assess_pi0(usable)["weak"]
    strict = assess_pi0(usable, WeakPi0(em=0.5, valid=0.94))
    assert strict["weak"] and strict["thresholds"] == {"em": 0.5, "valid": 0.94}
    assert any("dev EM 0.430 < 0.5" in r for r in strict["reasons"]) and any("0.930 < 0.94" in r for r in strict["reasons"])
    for bad in ({"em": -0.1}, {"valid": 1.5}):
        with pytest.raises(ValueError, match="threshold"):
            WeakPi0(**bad)


def test_world_settings_from_key_values():
    s = parse_world_settings(["test_per_dataset=100", "bands=400", "index_kind=bm25"], seed=7)
    assert (s.seed, s.test_per_dataset, s.bands, s.index_kind, s.towns) == (7, 100, 400, "bm25", WorldSettings().towns)
    q = parse_world_settings(["dev_per_dataset=3"], seed=1, quick=True)
    assert q.bands == QUICK_WORLD["bands"] and q.dev_per_dataset == 3
    for bad in (["seed=3"], ["nope=1"], ["bands"], ["bands=many"]):
        with pytest.raises(ValueError):
            parse_world_settings(bad)


def test_pi0_settings_from_key_values():
    assert parse_pi0_settings(["search_first=0.45", "steps=12", "max_questions=7"]) == {
        "search_first": 0.45, "steps": 12, "max_questions": 7}
    assert parse_pi0_settings(["max_questions=None"]) == {"max_questions": None}
    for bad in (["seed=3"], ["workflows=cmas"], ["nope=1"], ["steps"], ["steps=many"], ["search_first=1.5"],
                ["right_pick=-0.1"], ["steps=0"]):
        with pytest.raises(ValueError):
            parse_pi0_settings(bad)


def test_demo_settings_reject_a_bad_pi0_setting():
    from mopd.recipes.tiny_world.pipeline import DemoSettings

    assert DemoSettings(pi0=["search_first=0.5"]).pi0 == ["search_first=0.5"]
    with pytest.raises(ValueError, match="search_first"):
        DemoSettings(pi0=["search_first=5"])


@pytest.mark.slow
def test_pi0_check_cli_on_seeds_builds_reuses_and_tabulates(tmp_path, capsys):
    import json

    from mopd.cli import main

    small = ["bands=24", "companies=8", "towns=8", "rivers=4", "twins=2", "distractors=20", "test_per_dataset=4",
             "dev_per_dataset=2"]
    argv = ["world", "pi0-check", "--seeds", "1", "2", "--out", str(tmp_path), "--attempts", "1", "--pi0-steps", "2",
            "--bm25", "--world-setting", *small]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| 1 |" in out and "| 2 |" in out and "2 of 2 seeds weak" in out   # 2 SFT steps: nothing valid yet
    table = json.loads((tmp_path / "pi0_check.json").read_text())
    assert set(table) == {"1", "2"} and table["1"]["weak"] and table["1"]["thresholds"]["em"] == 0.15
    # the layout mopd demo --seeds reuses; a second call measures nothing again
    model = tmp_path / "seed2" / "pi0" / "model.safetensors"
    stamp = model.stat().st_mtime_ns, (tmp_path / "seed2" / "pi0_check.json").stat().st_mtime_ns
    assert main(argv) == 0
    assert (model.stat().st_mtime_ns, (tmp_path / "seed2" / "pi0_check.json").stat().st_mtime_ns) == stamp
    assert main(["world", "pi0-check", "--seeds", "1", "--out", str(tmp_path), "--world-setting", "nope=1"]) == 2
    # a warm-start setting is a new recipe: pi_0 is rebuilt with it (its demonstrations search less) and checked again
    from mopd.recipes.tiny_world.warmstart import read_pi0

    before = read_pi0(tmp_path / "seed2" / "pi0")["demonstrations"]["world/cmas"]["searches_per_episode"]
    assert main(argv + ["--pi0", "search_first=0.25"]) == 0
    after = read_pi0(tmp_path / "seed2" / "pi0")
    assert after["settings"]["search_first"] == 0.25
    assert after["demonstrations"]["world/cmas"]["searches_per_episode"] < before
    assert model.stat().st_mtime_ns != stamp[0]
    assert main(argv + ["--pi0", "search_first=2"]) == 2


@pytest.mark.slow
def test_pi0_check_side_by_side_gives_the_records_of_one_process(tmp_path):
    """The pi_0 check's workflows in two processes measure exactly what one process measures
    (the demo runs them side by side to save a minute; its published check must not move)."""
    from mopd.recipes.tiny_world.policy_check import check_policy, check_policy_side_by_side
    from mopd.recipes.tiny_world.world import build_world, parse_world_settings
    from mopd.recipes.tiny_world.warmstart import build_pi0

    small = ["bands=24", "companies=8", "towns=8", "rivers=4", "twins=2", "distractors=20", "test_per_dataset=4",
             "dev_per_dataset=3", "index_kind=bm25"]
    world = build_world(tmp_path / "world", settings=parse_world_settings(small, seed=3))
    pi0 = build_pi0(world.root, tmp_path / "pi0", seed=3, steps=40, progress=False)
    one = check_policy(pi0, world.root, split="dev", attempts=2, seed=5)
    two = check_policy_side_by_side(pi0, world.root, workers=2, split="dev", attempts=2, seed=5)
    assert list(two) == ["cmas", "hmas"]
    assert two == one
    assert one["cmas"]["tokens"] != one["hmas"]["tokens"]   # two different measurements, not one copied
