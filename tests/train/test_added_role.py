"""Adding a role and a workflow, as a contributor would: an entry in the role table, one agent class,
an entry in the workflow table with its state machine; then the config accepts the workflow, the
rewards, the loss and the method summary read the new role from the table, and the trainer trains it
for one step, without any other file knowing about either."""

import pytest
import torch

from mopd.config import describe, resolve
from mopd.core.workflows import Workflow, add_workflow, remove_workflow
from mopd.core.actions import parse_answerer
from mopd.core.records import AgentCall
from mopd.core.roles import Role, add_role, remove_role, role_id, role_names
from mopd.core.scoring import extract_answer
from mopd.rollout.chat import render_ids
from mopd.rollout.run_state import STATE_MACHINES, RunContext, Turn, register_state_machine
from mopd.rollout import scheduler
from mopd.rollout.scripted_engine import ScriptedEngine
from mopd.rollout.transcript import Transcript
from mopd.train.trainer import PolicyTrainer
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.training import tiny_overrides

# --- 1. the role table --------------------------------------------------------------------------
CHECKER = Role(
    name="checker",
    system_prompt="You are the Checker of a question-answering team. Give the answer you would check "
                  "inside <answer>...</answer>.",
    stop=("</answer>",),
    parse=parse_answerer,
    grouping="request",       # each call is rewarded by its own answer, normalised within its request
)


# --- 2. one agent class -------------------------------------------------------------------------
class Checker:
    """``n`` Checker calls on the question, one request."""

    def __init__(self, ctx: RunContext, n: int):
        self.ctx, self.n = ctx, n

    def turn(self):
        ctx, r = self.ctx, self.ctx.record
        prompt = render_ids(ctx.tokenizer, [{"role": "system", "content": CHECKER.system_prompt},
                                            {"role": "user", "content": f"Question: {r.question}"}])
        self.transcripts = []
        for j in range(self.n):
            call = AgentCall(call_id=f"k0.{j}", role="checker", step=ctx.step, group=f"{r.group_id}/{r.attempt}/k0")
            r.calls.append(call)
            t = Transcript(call, ctx.tokenizer, ctx.settings.max_input_tokens)
            t.start(prompt)
            self.transcripts.append(t)
        return t.request(ctx.params("checker", "k0", 0, n=self.n))

    def receive(self, completions):
        for t, c in zip(self.transcripts, completions, strict=True):
            t.add_model_turn(c)
            if not parse_answerer(c.text).valid:
                t.call.invalid = True
        self.ctx.record.candidates = [c.text for c in completions]
        self.ctx.record.final_answer = extract_answer(completions[-1].text)


# --- 3. one workflow ----------------------------------------------------------------------------
class CheckRun:
    """One step: the Checker answers; nothing else."""

    def __init__(self, ctx: RunContext):
        self.ctx, self.checker, self.done = ctx, Checker(ctx, ctx.settings.answer_candidates), False

    def begin_step(self):
        self.ctx.step += 1
        return [Turn(self.checker.turn(), self.checker.receive)]

    def searches(self):
        return []

    def end_step(self):
        self.done = True
        self.ctx.finish()


CHECK = Workflow("check", roles=("checker",), max_steps=1, description="the Checker answers alone")


def check_rollout(engine, retriever, tokenizer, questions, settings, *, attempts, method="", progress=False):
    """The scheduler's own rollout of ``settings.workflow`` (the toy workflow, found in the registry),
    with a scripted policy whose answers are right for some candidates and wrong for others."""
    def respond(prompt, params):
        return [f"<answer>town {j % 3}</answer>" for j in range(params.n)]

    assert settings.workflow == "check"
    return scheduler.run_workflows(ScriptedEngine(tokenizer, respond), retriever, tokenizer, questions, settings,
                                   attempts=attempts, method=method, progress=False)


@pytest.fixture
def checker_role():
    add_role(CHECKER)
    add_workflow(CHECK)
    register_state_machine("check")(CheckRun)   # as ``@register_state_machine("check")`` on the class
    yield CHECKER
    STATE_MACHINES.unregister("check")
    remove_workflow(CHECK.name)
    remove_role(CHECKER.name)


def test_a_fourth_role_trains_one_step(checker_role, tiny_model_dir, qa_file, tmp_path):
    assert role_names()[-1] == "checker" and role_id("checker") == 3
    cfg = resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path / "run",
                                            **{"rollout.answer_candidates": 3, "trainer.ppo_minibatches": 1,
                                               "rollout.workflow": "check", "algo.checker.entropy_coef": 0.002}))
    # the config and the method summary know the new role and workflow from the tables alone
    assert cfg.reward.of("checker") == "candidate_em" and cfg.algo.role("checker").entropy_coef == 0.002
    summary = describe(cfg)
    assert "(check)" in summary and "checker   GRPO on reward=candidate_em" in summary
    assert "searcher" not in summary.split("teacher:")[0]
    t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False, rollout_fn=check_rollout)
    before = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
    m = t.train_step()
    # the checker's tokens were packed with its role id, rewarded, normalised and trained
    assert m["adv/checker_abs"] > 0.5
    assert m["loss/checker_entropy_mean"] > 0 and m["loss/checker_pg_loss"] != 0
    assert "loss/answerer_entropy_mean" not in m and "loss/searcher_pg_loss" not in m
    assert m["loss/skipped_updates"] == 0.0
    after = t.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_the_table_refuses_clashing_roles(checker_role):
    add_role(CHECKER)  # the same role again: no change
    assert role_names().count("checker") == 1
    with pytest.raises(ValueError, match="already in the table"):
        add_role(Role("checker", "another prompt", (), parse_answerer))
    with pytest.raises(ValueError, match="system prompt must differ"):
        add_role(Role("copycat", CHECKER.system_prompt, (), parse_answerer))
    with pytest.raises(ValueError, match="built-in"):
        remove_role("answerer")
    with pytest.raises(ValueError, match="grouping"):
        Role("x", "x", (), parse_answerer, grouping="per_token")


def test_every_workflow_of_the_table_has_a_state_machine():
    from mopd.core.workflows import workflow_names

    assert sorted(STATE_MACHINES) == sorted(workflow_names())
    with pytest.raises(ValueError, match="no workflow 'ghost' in the workflow table"):
        register_state_machine("ghost")


def test_the_workflow_table_refuses_bad_entries(checker_role):
    add_workflow(CHECK)  # the same workflow again: no change
    with pytest.raises(ValueError, match="already in the table"):
        add_workflow(Workflow("check", ("checker", "answerer"), 2, "another"))
    with pytest.raises(ValueError, match="not in the role table"):
        add_workflow(Workflow("ghost", ("nobody",), 1, "a role that does not exist"))
    with pytest.raises(ValueError, match="runs no role"):
        Workflow("empty", (), 1, "no roles")
    with pytest.raises(ValueError, match="built-in"):
        remove_workflow("hmas")
