"""``reward.kl_coef`` > 0 with ``reward.kl_roles`` empty trained with no KL anywhere and said nothing:
it is refused in one line naming both keys, before anything loads; every preset stays valid."""

import random

import pytest

from mopd.cli import main
from mopd.config import ConfigError, get_preset, preset_names, resolve


@pytest.mark.parametrize("preset,overrides", [
    ("cmas_rl", ["reward.kl_coef={coef}"]),
    ("mopd", ["reward.kl_roles=[]"]),                       # the paper's 1e-3 left without its roles
    ("mopd", ["reward.kl_coef={coef}", "reward.kl_roles=[]"]),
])
def test_a_kl_coefficient_without_kl_roles_is_refused_in_one_line(preset, overrides):
    coef = random.Random(59).uniform(1e-4, 0.5)
    with pytest.raises(ConfigError) as e:
        resolve(preset, [o.format(coef=coef) for o in overrides])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("reward.kl_coef=") and "reward.kl_roles is empty" in msg, msg


def test_the_command_line_refuses_it_before_a_run_directory_exists(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "cmas_rl", "reward.kl_coef=0.02", f"trainer.out_dir={out}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("mopd train: error: reward.kl_coef=0.02 puts a KL in no role's reward") and \
        "\n" not in err, err
    assert not out.exists()


def test_a_kl_with_roles_or_no_kl_at_all_is_accepted_and_every_preset_builds():
    assert resolve("cmas_rl", ["reward.kl_coef=0.3", "reward.kl_roles=[searcher]"]).reward.kl_roles == ["searcher"]
    assert resolve("mopd", ["reward.kl_coef=0", "reward.kl_roles=[]"]).reward.kl_coef == 0
    for name in preset_names():   # the core's and the recipes'
        cfg = get_preset(name)()
        assert cfg.reward.kl_coef == 0 or cfg.reward.kl_roles, name
