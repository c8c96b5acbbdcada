"""Adding a role, as a contributor would: an entry in the role table, one agent class, one workflow,
and the trainer trains it for one step without any other file knowing about it."""

import pytest
import torch

from mopd.config import resolve
from mopd.core.actions import parse_answerer
from mopd.core.records import AgentCall, WorkflowRecord
from mopd.core.roles import Role, add_role, remove_role, role_id, role_names
from mopd.core.scoring import extract_answer
from mopd.rollout.chat import render_ids
from mopd.rollout.run_state import RunContext, Turn
from mopd.rollout.scheduler import run_steps
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

    workflow = "check"

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


def check_rollout(engine, retriever, tokenizer, questions, settings, *, attempts, method="", progress=False):
    """A ``run_workflows``-compatible rollout of the toy workflow, with a scripted policy whose
    answers are right for some candidates and wrong for others."""
    def respond(prompt, params):
        return [f"<answer>town {j % 3}</answer>" for j in range(params.n)]

    runs = []
    for q in questions:
        for a in range(attempts):
            rec = WorkflowRecord(question_id=q.id, dataset=q.dataset, question=q.question, answers=list(q.answers),
                                 attempt=a, method=method, workflow=CheckRun.workflow, group_id=f"{q.dataset}/{q.id}#0")
            runs.append(CheckRun(RunContext(rec, tokenizer, settings)))
    run_steps(ScriptedEngine(tokenizer, respond), retriever, runs, topk=settings.topk)
    return [r.ctx.record for r in runs]


@pytest.fixture
def checker_role():
    add_role(CHECKER)
    yield CHECKER
    remove_role(CHECKER.name)


def test_a_fourth_role_trains_one_step(checker_role, tiny_model_dir, qa_file, tmp_path):
    assert role_names()[-1] == "checker" and role_id("checker") == 3
    cfg = resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path / "run",
                                            **{"rollout.answer_candidates": 3, "trainer.ppo_minibatches": 1}))
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
