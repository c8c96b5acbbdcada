"""Adding a rollout engine and a reward, as a contributor would: one new module each, holding the
class and its registration, and nothing else. The config then accepts both names (and lists them
when refusing a typo), the trainer builds the engine ``rollout.engine`` names and pays the Searcher
the reward ``reward.searcher`` names, for one step."""

import importlib
import sys
import textwrap

import pytest

from mopd.config import ENGINES, REWARDS, ConfigError, resolve
from mopd.train.trainer import PolicyTrainer
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.training import tiny_overrides

# --- 1. the engine's module: an Engine (here scripted: it writes a valid C-MAS team) and its builder
ENGINE_MODULE = '''
    import re

    from mopd.config import register_engine
    from mopd.core.roles import role_of_prompt
    from mopd.rollout.scripted_engine import ScriptedEngine


    def respond(prompt, params):
        """The Searcher reports at once; the Answerer's first candidate is right (band i was formed in
        town i % 3, as the test questions say), the others wrong."""
        if role_of_prompt(prompt) == "answerer":
            i = int(re.search(r"band (\\d+) formed", prompt).group(1))
            return [f"<answer>town {i % 3}</answer>"] + ["<answer>nowhere</answer>"] * (params.n - 1)
        return "<report>the band was formed in a town</report>"


    class TownsEngine(ScriptedEngine):
        """Writes the same team whatever its weights."""


    @register_engine("towns")
    def build(rollout_cfg, model_path, *, dtype, device, trainer_model):
        if trainer_model is not None:
            tokenizer = trainer_model[1]
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
        return TownsEngine(tokenizer, respond)
'''

# --- 2. the reward's module: a reward class and its registration -----------------------------------
REWARD_MODULE = '''
    from dataclasses import dataclass

    from mopd.algo.rewards import Team
    from mopd.config import register_reward


    @register_reward("half_team")
    @dataclass(frozen=True)
    class HalfTeam(Team):
        """Half the team outcome, for every call of the role."""

        def __call__(self, record, calls, r_em, judge):
            return {c.call_id: 0.5 * r_em for c in calls}
'''


@pytest.fixture
def added_modules(tmp_path, monkeypatch):
    """The two modules as files of their own, imported as a user's package would be."""
    (tmp_path / "towns_engine.py").write_text(textwrap.dedent(ENGINE_MODULE))
    (tmp_path / "half_team_reward.py").write_text(textwrap.dedent(REWARD_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    engine, reward = importlib.import_module("towns_engine"), importlib.import_module("half_team_reward")
    yield engine, reward
    ENGINES.unregister("towns")
    REWARDS.unregister("half_team")
    for name in ("towns_engine", "half_team_reward"):
        sys.modules.pop(name, None)


def test_an_added_engine_and_reward_are_accepted_and_used(added_modules, tiny_model_dir, qa_file, tmp_path):
    engine_module, reward_module = added_modules
    assert "towns" in ENGINES and "half_team" in REWARDS
    overrides = tiny_overrides(tiny_model_dir, qa_file, tmp_path / "run",
                               **{"rollout.engine": "towns", "reward.searcher": "half_team",
                                  "rollout.answer_candidates": 2, "trainer.ppo_minibatches": 1})
    cfg = resolve("cmas_rl", overrides)
    assert cfg.rollout.engine == "towns" and cfg.reward.of("searcher") == "half_team"
    # a typo is refused in one line that names the added choices with the built-in ones
    for key, bad, valid in (("rollout.engine", "town", "'towns'"), ("reward.searcher", "half", "'half_team'")):
        with pytest.raises(ConfigError) as e:
            resolve("cmas_rl", [f"{key}={bad}"])
        assert valid in str(e.value) and "\n" not in str(e.value)

    t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)
    assert isinstance(t.engine, engine_module.TownsEngine)
    m = t.train_step()
    assert t.engine.batches                                 # the rollout was the added engine's
    assert m["reward/answerer"] == pytest.approx(0.5)        # candidate_em: one of two candidates right
    assert m["reward/searcher"] == pytest.approx(0.5)        # half_team: half of R_EM = 1


def test_a_removed_engine_or_reward_is_refused_again(added_modules):
    ENGINES.unregister("towns")
    REWARDS.unregister("half_team")
    with pytest.raises(ConfigError, match="rollout.engine='towns' is not valid; choose one of"):
        resolve("cmas_rl", ["rollout.engine=towns"])
    with pytest.raises(ConfigError, match="reward.roles.searcher='half_team' is not valid"):
        resolve("cmas_rl", ["reward.searcher=half_team"])
