"""`mopd pipeline demo_quick --dry-run`: the demo's world and pi_0 stages are listed, and nothing is
built or loaded."""

import mopd.recipes.tiny_world.warmstart
import mopd.recipes.tiny_world.world
from mopd.cli import main
from tests.helpers.dry_run import refuse_loading


def test_the_demos_dry_run_lists_its_world_and_pi0_stages(monkeypatch, capsys, tmp_path):
    refuse_loading(monkeypatch, (mopd.recipes.tiny_world.world, "build_world"),
                   (mopd.recipes.tiny_world.warmstart, "build_pi0"))
    assert main(["pipeline", "demo_quick", "--dry-run", f"root={tmp_path}/d"]) == 0
    out = capsys.readouterr().out
    for key in ("world", "pi0", "pi0_check", "stage1", "stage2.mopd", "stage2.no_searcher_supervision",
                "eval.no_searcher_supervision", "report"):
        assert f"] {key}: " in out
    assert "in-process: mopd.recipes.tiny_world.world.build_world" in out and "mopd.recipes.tiny_world.stages.claims_report" in out
