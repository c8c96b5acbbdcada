"""The demo evaluates each system with the workflow its training stages used."""

import pytest

from mopd.demo import DemoSettings, _evaluate


@pytest.mark.parametrize("overrides, sees", [([], False), (["rollout.searcher_sees_question=true"], True)])
def test_the_searcher_template_of_training_is_the_one_evaluated(monkeypatch, tmp_path, overrides, sees):
    import mopd.eval.runner as runner

    plans = []
    monkeypatch.setattr(runner, "evaluate", lambda model, tok, retriever, questions, plan, cfg, **kw: plans.append(plan))
    s = DemoSettings(out=str(tmp_path), overrides=overrides)
    _evaluate("MultiAgent-OPD", "model", "hmas", [], None, s, tmp_path / "eval")
    (plan,) = plans
    assert plan.settings.workflow == "hmas" and plan.settings.searcher_sees_question is sees
    assert plan.settings.max_searchers_per_wave == 0          # no wave cap, as in training
