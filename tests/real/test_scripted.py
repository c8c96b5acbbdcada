"""Every branch of both workflows under every test chat template, over SmolLM2's real tokenizer:
a scripted team (tests.helpers.prompts' role reader, fixed texts) on the quick world's BM25 index.

The real model itself rarely writes a valid action zero-shot (its Leader never delegates, so its
H-MAS Searchers never run); here the texts are fixed, so every continuation is reached: a search and
its passages, an invalid action and the re-ask, a report, a wave's reports shown to the Leader, a
select, a Thinking model's ``reasoning</think>`` before each action, with the real BPE (no tag is a
token of its own) and each template's own special text. Every call is checked token-exactly. No
model runs: this module runs in the HF pass of `make test-real` only."""

import pytest
from transformers import AutoTokenizer

from mopd.config import RetrieverConfig
from mopd.core.qa import load_questions
from mopd.retriever import load_retriever
from mopd.rollout.prompts import INVALID_SEARCHER
from mopd.rollout.run_state import WorkflowSettings
from mopd.rollout.scheduler import run_workflows
from mopd.rollout.scripted_engine import ScriptedEngine
from tests.helpers.chat_templates import STABLE_HISTORY, TEMPLATES
from tests.helpers.prompts import role_of
from tests.real.exactness import check_records
from tests.real.support import engine, require_real

require_real()
pytestmark = [pytest.mark.real,
              pytest.mark.skipif(engine() != "hf", reason="no engine runs here: the HF pass covers it")]

THINK = "The reports say enough.\n</think>\n\n"
"""A Thinking model's reasoning, closed: its generation prompt opened the block."""
RESULTS = "Doc 1(Title:"
"""Text of the passages of a search, in the Searcher's prompt (its system prompt names the tags too)."""


def scripted(name, first_question):
    lead = THINK if name == "qwen3_2507_thinking" else ""

    def respond(prompt, params):
        role = role_of(prompt)
        if role == "searcher":
            if RESULTS in prompt:
                return lead + "<report>The band was formed in Norwick, by the river Lune.</report>"
            if (first_question in prompt or "Find out:" in prompt) and INVALID_SEARCHER not in prompt:
                return "I think it was formed in a small town."            # invalid: no action
            return lead + "<search>band formed town</search>"
        if role == "leader":
            if "Report 1 (task:" in prompt:
                return lead + "<select>1,2</select>"
            return lead + "<subtask>Where was the first band formed?</subtask><subtask>Find out: where was the " \
                          "second band formed?</subtask>"
        return lead + "<answer>Norwick</answer>"

    return respond


@pytest.fixture(scope="module")
def world_retriever(quick_world):
    return load_retriever(RetrieverConfig(kind="inprocess", index=str(quick_world.index)))


@pytest.mark.parametrize("workflow", ["cmas", "hmas"])
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_branch_is_token_exact(name, workflow, template_models, quick_world, world_retriever):
    tokenizer = AutoTokenizer.from_pretrained(template_models[name])
    kwargs = TEMPLATES[name][1]
    questions = load_questions(str(quick_world.test))[0][:2]
    settings = WorkflowSettings(workflow=workflow, max_steps=5 if workflow == "cmas" else 8, answer_candidates=2,
                                max_input_tokens=4096, max_output_tokens=64,
                                chat_template_kwargs=tuple(sorted(kwargs.items())))
    engine_ = ScriptedEngine(tokenizer, scripted(name, questions[0].question), record_batches=False)
    records = run_workflows(engine_, world_retriever, tokenizer, questions, settings, attempts=1, progress=False)
    assert [r.final_answer for r in records] == ["Norwick", "Norwick"]
    n = check_records(records, tokenizer, {tokenizer.eos_token_id}, kwargs, whole=name in STABLE_HISTORY)
    assert n == (3 if workflow == "cmas" else 5) * len(records)   # a Searcher (or a Leader and 2) and 2 candidates
    events = [e.kind for r in records for e in r.events]
    assert {"search", "report", "invalid", "answer"} <= set(events)
    if workflow == "hmas":
        assert {"subtask", "select"} <= set(events)
        leaders = [c for r in records for c in r.calls if c.role == "leader"]
        assert all(sum(s.source == "model" for s in c.segments) == 2 for c in leaders)   # after its wave
    searches = [e for r in records for e in r.events if e.kind == "search"]
    assert all(len(e.passages) == 3 for e in searches)    # run on the real index
