"""The scripted demonstration policy, run through the real workflows: valid, token-exact, imperfect."""

import random

import pytest

from mopd.core.actions import parse_answerer, parse_leader, parse_searcher
from mopd.core.roles import role
from mopd.core.scoring import exact_match
from mopd.recipes.tiny_world.scripted_policy import SUBTASK_RIVER, SUBTASK_TOWN, DemoEngine, DemoStyle, world_policy
from mopd.recipes.tiny_world.prompt_reader import read_prompt
from mopd.recipes.tiny_world.world import load_question_meta, load_split
from mopd.recipes.tiny_world.warmstart import workflow_settings
from mopd.retriever import Passage
from mopd.rollout import prompts
from mopd.rollout.chat import continuation_ids
from mopd.rollout.scheduler import run_workflows

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # tiny models: one thread is fast and steady

PERFECT = DemoStyle(good_query=1.0, right_copy=1.0, right_pick=1.0, search_first=1.0, good_subtask=1.0,
                    split_pair=1.0, both_facts=1.0)
CARELESS = DemoStyle(good_query=0.0, right_copy=0.0, right_pick=0.0, search_first=0.0, good_subtask=0.0,
                     split_pair=0.0, both_facts=0.0)


def run(world, tok, retriever, workflow, questions, style=None, seed=0, attempts=1):
    engine = DemoEngine(world_policy(world.root, style or DemoStyle()), tok, seed=seed)
    settings = workflow_settings(workflow, temperature=1.0, top_p=1.0, seed=seed)
    return run_workflows(engine, retriever, tok, questions, settings, attempts=attempts, progress=False)


def em(records):
    return sum(exact_match(r.final_answer, r.answers) for r in records) / len(records)


def test_read_prompt_recovers_each_roles_state(world_tokenizer):
    tok = world_tokenizer
    docs = [Passage(id="1", title="Copper Lanterns", text="Copper Lanterns is a folk band formed in Ashford in 1990."),
            Passage(id="2", title="Varn (river)", text="The Varn is a river that flows through Ashford to the sea.")]
    ids = prompts.render_searcher_prompt(tok, "Q?", "Find X.", show_question=True)
    ids += tok.encode("<search>Copper Lanterns</search>", add_special_tokens=False)
    ids += continuation_ids(tok, prompts.searcher_feedback(docs, force_report=True), after_eos=False)
    view = read_prompt(tok.decode(ids))
    assert (view.role, view.question, view.subtask, view.forced) == ("searcher", "Q?", "Find X.", True)
    # by default an H-MAS Searcher sees its subtask as its question (one interface)
    plain = read_prompt(tok.decode(prompts.render_searcher_prompt(tok, "Q?", "Find X.")))
    assert (plain.role, plain.question, plain.subtask) == ("searcher", "Find X.", None)
    assert [d.title for d in view.docs] == ["Copper Lanterns", "Varn (river)"]
    assert view.docs[0].first_sentence == docs[0].text and view.outputs == ["<search>Copper Lanterns</search>"]

    ids = prompts.render_leader_prompt(tok, "Where?") + tok.encode("<subtask>A</subtask>", add_special_tokens=False)
    ids += [tok.eos_token_id] + continuation_ids(tok, prompts.leader_feedback(
        [prompts.Report(1, "A", "r one."), prompts.Report(2, "B", "")]))
    view = read_prompt(tok.decode(ids))
    assert view.role == "leader" and view.question == "Where?" and not view.forced
    assert view.reports == [(1, "A", "r one."), (2, "B", prompts.EMPTY_REPORT)]

    view = read_prompt(tok.decode(prompts.render_answerer_prompt(tok, "Which?", ["a b.", "c."])))
    assert view.role == "answerer" and view.question == "Which?"
    assert [t for _, _, t in view.reports] == ["a b.", "c."]
    with pytest.raises(ValueError):
        read_prompt("<|im_start|>system\nsomething else<|im_end|>\n")


@pytest.mark.parametrize("workflow", ["cmas", "hmas"])
def test_demonstrations_are_valid_token_exact_and_imperfect(world, world_tokenizer, retriever, workflow):
    tok = world_tokenizer
    qs = load_split(world, "train")[::6]
    records = run(world, tok, retriever, workflow, qs)
    assert len(records) == len(qs)
    for r in records:
        assert r.final_answer is not None
        roles = [c.role for c in r.calls]
        assert roles[-1] == "answerer" and "searcher" in roles and (workflow == "cmas") == ("leader" not in roles)
        for c in r.calls:
            assert not c.invalid and not c.truncated_input and set(c.finish_reasons) == {"stop"}
            ids, mask = c.token_ids(), c.loss_mask()
            assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)
            for s in c.segments:
                if s.source == "model":
                    # the EOS closes outputs without a stop string; a stopped action has none
                    ends_on_eos = s.token_ids[-1] == tok.eos_token_id
                    assert ends_on_eos != s.text.endswith(role(c.role).stop)
                    assert tok.decode(s.token_ids, skip_special_tokens=True) == s.text
                    parse = {"searcher": parse_searcher, "answerer": parse_answerer,
                             "leader": lambda t: parse_leader(t, 99)}[c.role]
                    assert parse(s.text).valid
    score = em(records)
    assert 0.15 < score < 0.8  # imperfect on purpose, but often right
    assert sum(r.search_actions for r in records) / len(records) > 1.0


def test_demonstrations_are_deterministic_for_a_seed(world, world_tokenizer, retriever):
    qs = load_split(world, "train")[:12]
    a = run(world, world_tokenizer, retriever, "hmas", qs, seed=5)
    b = run(world, world_tokenizer, retriever, "hmas", qs, seed=5)
    c = run(world, world_tokenizer, retriever, "hmas", qs, seed=6)
    def ids(recs):
        return [call.token_ids() for r in recs for call in r.calls]

    assert ids(a) == ids(b) and ids(a) != ids(c)


@pytest.mark.parametrize("workflow", ["cmas", "hmas"])
def test_a_careful_script_answers_almost_everything_and_a_careless_one_almost_nothing(
        world, world_tokenizer, retriever, workflow):
    qs = load_split(world, "train")[1::9]
    assert em(run(world, world_tokenizer, retriever, workflow, qs, PERFECT)) >= 0.9
    assert em(run(world, world_tokenizer, retriever, workflow, qs, CARELESS)) <= 0.2


def test_two_hop_demonstrations_search_for_both_hops(world, world_tokenizer, retriever):
    meta = load_question_meta(world)
    qs = [q for q in load_split(world, "train") if meta[q.question]["hops"] == 2][:15]
    for r in run(world, world_tokenizer, retriever, "cmas", qs, PERFECT):
        m = meta[r.question]
        queries = [e.text for e in r.events_of("search")]
        assert len(queries) == 2 and m["subject"] in queries[0] and m["town"] in queries[1]
        report = r.events_of("report")[0].text
        assert m["town"] in report and m["river"] in report
    records = run(world, world_tokenizer, retriever, "hmas", qs, PERFECT)
    for r in records:
        m = meta[r.question]
        subtasks = [e.text for e in r.events_of("subtask")]
        assert subtasks[0] in (SUBTASK_TOWN[m["kind"]].format(s=m["subject"]),
                               f"Find which river flows through the town where the {m['kind']} {m['subject']} "
                               f"{'was formed' if m['kind'] == 'band' else 'is headquartered'}.")
        if len(subtasks) > 1:
            assert subtasks[1] == SUBTASK_RIVER.format(t=m["town"])


def test_answerer_picks_among_the_names_in_the_reports(world):
    policy = world_policy(world.root, DemoStyle(right_pick=0.0))
    kb = policy.kb
    band = sorted(kb.bands)[0]
    town = kb.bands[band]["town"]
    other = next(t for t in sorted(kb.towns) if t != town)
    sentence = policy._gold_sentences[band]
    prompt = f"<|im_start|>system\n{prompts.ANSWERER_SYSTEM}<|im_end|>\n<|im_start|>user\n" + \
        prompts.ANSWERER_USER.format(reports=prompts.answerer_reports([sentence, f"They toured {other}."]),
                                     question=f"Where was the band {band} formed?") + "<|im_end|>\n"
    # right_pick 0: never the supported town, always the other name in the reports
    picks = {policy.act(prompt, random.Random(i)) for i in range(20)}
    assert picks == {f"<answer> {other}</answer>"}
    policy = world_policy(world.root, PERFECT)
    assert {policy.act(prompt, random.Random(i)) for i in range(5)} == {f"<answer> {town}</answer>"}
