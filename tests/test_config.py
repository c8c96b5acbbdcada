import pytest

from mopd.cli import main
from mopd.config import PRESETS, ConfigError, resolve


def test_every_preset_resolves_and_describes(capsys):
    for name in PRESETS:
        cfg = resolve(name)
        assert cfg.method == name
        assert main(["config", "show", name]) == 0
        out = capsys.readouterr().out
        assert f"method: {name}" in out and "teacher:" in out


def test_dotted_overrides_both_forms():
    cfg = resolve("mopd", ["--trainer.lr", "2e-6", "rollout.group_size=8", "--algo.dual_clip=3.0"])
    assert cfg.trainer.lr == 2e-6 and cfg.rollout.group_size == 8 and cfg.algo.dual_clip == 3.0
    assert cfg.algo.role("searcher").advantage == "opd" and cfg.reward.kl_roles == ["leader", "answerer"]


def test_unknown_key_names_it_and_the_choices():
    with pytest.raises(ConfigError) as e:
        resolve("cmas_rl", ["trainer.lrr=1"])
    assert "trainer.lrr" in str(e.value) and "trainer.lr" in str(e.value)


def test_wrong_type_and_bad_value():
    with pytest.raises(ConfigError, match="trainer.steps"):
        resolve("cmas_rl", ["trainer.steps=many"])
    with pytest.raises(ConfigError, match="rollout.engine='sglang'.*hf"):
        resolve("cmas_rl", ["rollout.engine=sglang"])
    with pytest.raises(ConfigError, match="dual_clip"):
        resolve("cmas_rl", ["algo.dual_clip=0.5"])
    with pytest.raises(ConfigError, match="unknown preset 'mpod'.*'mopd'"):
        resolve("mpod")
    with pytest.raises(ConfigError, match="key=value"):
        resolve("mopd", ["trainer.lr"])


def test_yaml_then_overrides(tmp_path):
    y = tmp_path / "run.yaml"
    y.write_text("trainer:\n  lr: 3.0e-6\n  steps: 7\nrollout:\n  group_size: 3\n")
    cfg = resolve("cmas_rl", ["trainer.steps=9"], str(y))
    assert (cfg.trainer.lr, cfg.trainer.steps, cfg.rollout.group_size) == (3e-6, 9, 3)
    y.write_text("trainer:\n  lrx: 1\n")
    with pytest.raises(ConfigError, match="lrx"):
        resolve("cmas_rl", None, str(y))


def test_teacher_required_at_training_time():
    cfg = resolve("mopd", ["model.path=/m", "data.train=/t.jsonl"])
    assert cfg.teacher_roles() == ["answerer", "leader", "searcher"]
    with pytest.raises(ConfigError, match="teacher.path"):
        cfg.check_trainable()
    resolve("cmas_rl", ["model.path=/m", "data.train=/t.jsonl"]).check_trainable()
    assert resolve("cmas_rl").teacher_roles() == []


def test_cli_reports_errors_without_traceback(capsys):
    assert main(["config", "show", "mopd", "--trainer.nope", "1"]) == 2
    err = capsys.readouterr().err
    assert "trainer.nope" in err and "Traceback" not in err


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in ("config", "data", "score"):
        assert cmd in out


def test_role_settings_by_role_name_in_both_spellings(tmp_path):
    """algo.roles / reward.roles are keyed by the role table's names; algo.<role> and reward.<role>
    say the same on the command line and in a YAML file (the keys the docs and earlier runs use)."""
    short = resolve("tiny_mopd", ["algo.searcher.opd_coef=0.37", "reward.leader=team", "--algo.answerer.kl_coef", "0.05"])
    full = resolve("tiny_mopd", ["algo.roles.searcher.opd_coef=0.37", "reward.roles.leader=team",
                                 "algo.roles.answerer.kl_coef=0.05"])
    assert short == full
    assert short.algo.role("searcher").opd_coef == 0.37 and short.algo.role("searcher").advantage == "opd"
    assert short.algo.role("searcher").entropy_coef == 1e-3          # the rest of the preset's spec stays
    assert short.reward.of("leader") == "team" and short.reward.of("searcher") == "none"
    y = tmp_path / "run.yaml"
    y.write_text("algo:\n  searcher:\n    opd_coef: 0.37\n  answerer:\n    kl_coef: 0.05\n"
                 "reward:\n  leader: team\n")
    assert resolve("tiny_mopd", None, str(y)) == full
    with pytest.raises(ConfigError, match="reward.roles.leader='bonus'"):
        resolve("mopd", ["reward.leader=bonus"])
    with pytest.raises(ConfigError, match="algo.roles.searcher.pg_coef=-1.0 must be >= 0"):
        resolve("mopd", ["algo.searcher.pg_coef=-1"])
    with pytest.raises(ConfigError, match="algo.roles.searcher.kl_type='k4' is not valid"):
        resolve("mopd", ["algo.searcher.kl_type=k4"])
    with pytest.raises(ConfigError, match="algo.roles.leader.advantage='grpo' is not valid; choose one of"):
        resolve("mopd", ["algo.leader.advantage=grpo"])
