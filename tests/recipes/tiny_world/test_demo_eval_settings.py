"""The demo evaluates each system with the workflow its training stages used."""

import pytest

from mopd.recipes.tiny_world.demo import demo_config
from mopd.recipes.tiny_world.pipeline import DemoSettings
from mopd.pipeline import inprocess
from mopd.pipeline.stages import EvalStage, plan as stages_of


@pytest.mark.parametrize("overrides, sees", [([], False), (["rollout.searcher_sees_question=true"], True)])
def test_the_searcher_template_of_training_is_the_one_evaluated(monkeypatch, tmp_path, overrides, sees):
    import mopd.eval.runner as runner

    plans = []
    monkeypatch.setattr(runner, "evaluate", lambda model, tok, retriever, questions, plan, cfg, **kw: plans.append(plan))
    s = DemoSettings(out=str(tmp_path), overrides=overrides)
    (stage,) = [e for e in stages_of(demo_config(s)) if isinstance(e, EvalStage) and e.system.name == "MultiAgent-OPD"]
    inprocess.evaluate(stage, [], None, lockstep=True, log=lambda line: None)
    (plan,) = plans
    assert plan.settings.workflow == "hmas" and plan.settings.searcher_sees_question is sees
    assert plan.settings.max_searchers_per_wave == 0          # no wave cap, as in training
