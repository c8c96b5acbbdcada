"""A config file whose top level or a section is not a mapping is a one-line error."""

import pytest

from mopd.cli import main
from mopd.config import ConfigError, resolve

CASES = [
    ("- a\n- b\n", "the top level must be a mapping of sections", "not a list"),
    ("5\n", "the top level must be a mapping of sections", "not a scalar"),
    ("trainer: 5\n", "'trainer' is a section; give it keys", "not 5"),
    ("trainer: [1, 2]\n", "'trainer' is a section", "not [1, 2]"),
    ("trainer:\n  lr: abc\n", "bad value for 'trainer.lr'", "could not be converted"),
]


@pytest.mark.parametrize("text,first,second", CASES, ids=[c[0].strip() for c in CASES])
def test_bad_config_files(tmp_path, capsys, text, first, second):
    f = tmp_path / "run.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=first):
        resolve("tiny_cmas_rl", [], str(f))
    for argv in (["config", "show", "--file", str(f), "tiny_cmas_rl"], ["train", "--file", str(f), "tiny_cmas_rl"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert first in err and second in err and "\n" not in err and "Traceback" not in err


def test_empty_and_good_files_still_load(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    assert resolve("tiny_cmas_rl", [], str(tmp_path / "empty.yaml")).trainer.steps == resolve("tiny_cmas_rl").trainer.steps
    (tmp_path / "good.yaml").write_text("trainer:\n  steps: 7\n")
    assert resolve("tiny_cmas_rl", [], str(tmp_path / "good.yaml")).trainer.steps == 7


def test_max_steps_below_what_the_workflow_needs_is_one_line_when_the_config_is_built():
    import pytest

    from mopd.config import ConfigError, resolve

    for preset, workflow in (("cmas_rl", "cmas"), ("mopd", "hmas")):
        with pytest.raises(ConfigError, match=f"rollout.max_steps=1: a {workflow} run needs at least 2"):
            resolve(preset, ["rollout.max_steps=1"])
    assert resolve("cmas_rl", ["rollout.max_steps=2"]).rollout.max_steps == 2
