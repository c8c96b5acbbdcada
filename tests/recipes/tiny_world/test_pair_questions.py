"""Pair questions (both bands' towns, both bands' genres): right answers, held-out subjects, tokens,
and a scripted team for which the hierarchy pays (two Searchers for two independent facts)."""

import dataclasses
import json
import random
from collections import Counter

import pytest

from mopd.core.scoring import exact_match
from mopd.recipes.tiny_world.scripted_policy import (
    PAIR_SUBTASK_TEXTS,
    SUBTASK_ONE,
    DemoEngine,
    DemoStyle,
    answer_text,
    world_policy,
)
from mopd.recipes.tiny_world.world import WorldSettings, build_world, load_question_meta, load_split, read_settings
from mopd.recipes.tiny_world.warmstart import workflow_settings
from mopd.recipes.tiny_world.world_kb import GENRES
from mopd.recipes.tiny_world.world_text import CHAIN_DATASETS, PAIR_DATASETS, PAIR_GENRES, PAIR_TOWNS
from mopd.rollout import prompts
from mopd.rollout.scheduler import run_workflows

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # tiny models: one thread is fast and steady

PERFECT = DemoStyle(good_query=1.0, right_copy=1.0, right_pick=1.0, search_first=1.0, good_subtask=1.0,
                    split_pair=1.0, both_facts=1.0)


def all_questions(paths):
    return [q for s in ("train", "dev", "test") for q in load_split(paths, s)]


@pytest.mark.parametrize("seed", [7, 31])
def test_pair_answers_follow_from_the_knowledge_base(tmp_path, seed):
    paths = build_world(tmp_path / "w", settings=WorldSettings(seed=seed, bands=60, companies=6, towns=10, rivers=4,
                                                               twins=4, distractors=30, pair_questions=40,
                                                               test_per_dataset=8, dev_per_dataset=4,
                                                               index_kind="bm25"))
    bands = json.loads(paths.kb.read_text())["bands"]  # the raw file, not the code under test
    corpus = {r["id"]: r["contents"] for r in map(json.loads, paths.corpus.open())}
    meta = load_question_meta(paths)
    counts = Counter()
    for q in all_questions(paths):
        if q.dataset not in PAIR_DATASETS:
            continue
        counts[q.dataset] += 1
        m = meta[q.question]
        a, b = m["subjects"]
        assert a != b and a in q.question and b in q.question and q.question.index(a) < q.question.index(b)
        assert m["subject"] == a and m["hops"] == 2 and m["kind"] == "band"
        assert m["towns"] == [bands[a]["town"], bands[b]["town"]] and m["years"] == [bands[a]["year"], bands[b]["year"]]
        assert m["genres"] == [bands[a]["genre"], bands[b]["genre"]]
        # both gold passages name their band, its genre, its town and its year
        for band, g in zip((a, b), m["gold"], strict=True):
            title, _, text = corpus[g].partition("\n")
            assert title == band and bands[band]["town"] in text and str(bands[band]["year"]) in text
            assert f" {bands[band]['genre']} " in text
        rel = {PAIR_TOWNS: "town", PAIR_GENRES: "genre"}[q.dataset]
        x, y = bands[a][rel], bands[b][rel]
        assert m["relation"] == rel and x != y
        assert q.answers == [f"{x} and {y}", f"{y} and {x}"]
        assert exact_match(f"{y} and {x}.", q.answers) and not exact_match(x, q.answers)
    assert counts == {PAIR_TOWNS: 40, PAIR_GENRES: 40}
    info = read_settings(paths.root)
    assert info["questions_by_dataset"]["test"] == {d: 8 for d in CHAIN_DATASETS + PAIR_DATASETS}


def test_pair_answers_spread_over_the_names(world):
    """No name dominates the pair answers (a guess of the commonest would score little): towns are
    dealt evenly to bands, genres drawn uniformly."""
    for ds, n_names in ((PAIR_TOWNS, 60), (PAIR_GENRES, len(GENRES))):
        halves = Counter(h for q in all_questions(world) if q.dataset == ds for h in q.answers[0].split(" and "))
        assert sum(halves.values()) == 800 and len(halves) == n_names, ds
        assert max(halves.values()) / 800 < 3.0 / n_names, (ds, halves.most_common(3))


def test_pair_questions_are_drawn_on_distinct_bands_per_type(world):
    """Each pair type's pool is a matching while the bands last (about 200 pairs over 416 bands; the
    greedy matching may leave a few bands of one genre unpaired), then distinct pairs that reuse
    bands, so the test questions can each have bands of their own and no pair is asked twice."""
    meta = load_question_meta(world)
    for ds in PAIR_DATASETS:
        qs = sorted((q for q in all_questions(world) if q.dataset == ds), key=lambda q: q.id)  # the pool's order
        pairs = [tuple(meta[q.question]["subjects"]) for q in qs]
        assert len(pairs) == 400 and len({frozenset(p) for p in pairs}) == 400, ds
        matching = [b for p in pairs[:196] for b in p]   # the matching first
        assert len(set(matching)) == len(matching), ds
        assert max(Counter(b for p in pairs for b in p).values()) <= 8, ds  # random fill: no band dominates


def test_held_out_pair_questions_have_subjects_of_their_own(tmp_path):
    """With enough bands, no test question shares a subject with another one, and each test
    question's subjects still have other questions in training (as the chain rule keeps a sibling)."""
    paths = build_world(tmp_path / "w", settings=WorldSettings(seed=3, test_per_dataset=25, dev_per_dataset=5,
                                                               index_kind="bm25"))
    meta = load_question_meta(paths)
    test = load_split(paths, "test")
    assert Counter(q.dataset for q in test) == {d: 25 for d in CHAIN_DATASETS + PAIR_DATASETS}
    subjects = [s for q in test for s in meta[q.question].get("subjects", [meta[q.question]["subject"]])]
    assert len(subjects) == 50 + 100 and len(set(subjects)) == len(subjects)
    train = {q.question for s in ("train", "dev") for q in load_split(paths, s)}
    assert not train & {q.question for q in test}
    trained = {s for q in train for s in meta[q].get("subjects", [meta[q]["subject"]])}
    assert set(subjects) <= trained


def test_a_small_world_without_enough_pairs_is_refused():
    with pytest.raises(ValueError, match="pair_questions"):
        WorldSettings(pair_questions=10, test_per_dataset=10, dev_per_dataset=2)


def test_the_tokenizer_writes_each_half_of_a_pair_answer_as_one_name_token(world, world_tokenizer):
    tok = world_tokenizer
    for q in [q for q in all_questions(world) if q.dataset in PAIR_DATASETS][::25]:
        x, y = q.answers[0].split(" and ")
        text = answer_text(q.answers[0])
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        # the answer's ids are <answer>'s, one token per name and one for " and", then </answer>'s; each
        # name the very token a passage holds it as (the Answerer copies it from a report)
        opening = tok.encode("<answer>", add_special_tokens=False)
        body = ids[len(opening):len(opening) + 3]
        assert [tok.decode([i]) for i in body] == [f" {x}", " and", f" {y}"], q
        assert ids[len(opening) + 3:] == tok.encode("</answer>", add_special_tokens=False)
        for name, tid in ((x, body[0]), (y, body[2])):
            assert tid in tok.encode(f"formed in {name} in", add_special_tokens=False)
    band = sorted(json.loads(world.kb.read_text())["bands"])[5]
    for text in PAIR_SUBTASK_TEXTS:
        text = text.format(s=band, a=band, b=band)
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text and len(ids) <= len(text.split()) + 2, text


def answerer_prompt(question, reports):
    return (f"<|im_start|>system\n{prompts.ANSWERER_SYSTEM}<|im_end|>\n<|im_start|>user\n"
            + prompts.ANSWERER_USER.format(reports=prompts.answerer_reports(reports), question=question)
            + "<|im_end|>\n")


def test_the_answerer_copies_both_values_or_guesses_the_missing_one(world):
    meta = load_question_meta(world)
    towns = json.loads(world.kb.read_text())["towns"]
    for ds in PAIR_DATASETS:
        for q in [q for q in all_questions(world) if q.dataset == ds][:6]:
            a, b = meta[q.question]["subjects"]
            x, y = q.answers[0].split(" and ")
            names = set(towns) if ds == PAIR_TOWNS else set(GENRES)
            right = world_policy(world.root, PERFECT)
            sentences = [right._gold_sentences[a], right._gold_sentences[b]]
            full = answerer_prompt(q.question, sentences)
            assert {right.act(full, random.Random(i)) for i in range(5)} == {answer_text(f"{x} and {y}")}
            wrong = world_policy(world.root, DemoStyle(right_pick=0.0))
            for i in range(10):  # one half swapped for another name of the kind
                u, v = wrong.act(full, random.Random(i))[len("<answer> "):-len("</answer>")].split(" and ")
                assert (u == x) != (v == y) and {u, v} <= names
                assert (v if u == x else u) not in (x, y)
            half = answerer_prompt(q.question, sentences[:1])
            seconds = set()
            for i in range(40):
                u, v = right.act(half, random.Random(i))[len("<answer> "):-len("</answer>")].split(" and ")
                assert u == x and v in names - {x}
                seconds.add(v)
            assert len(seconds) > 3  # a guess among the names of the kind, not a fixed one


def run(world, tok, retriever, workflow, questions, style=None, attempts=1, seed=0):
    engine = DemoEngine(world_policy(world.root, style or DemoStyle()), tok, seed=seed)
    settings = workflow_settings(workflow, temperature=1.0, top_p=1.0, seed=seed)
    return run_workflows(engine, retriever, tok, questions, settings, attempts=attempts, progress=False)


def test_a_careful_team_searches_both_bands(world, world_tokenizer, retriever):
    meta = load_question_meta(world)
    qs = [q for q in load_split(world, "train") if q.dataset in PAIR_DATASETS][::8]
    for r in run(world, world_tokenizer, retriever, "cmas", qs, PERFECT):
        a, b = meta[r.question]["subjects"]
        queries = [e.text for e in r.events_of("search")]
        assert len(queries) == 2 and a in queries[0] and b in queries[1]
        assert exact_match(r.final_answer, r.answers)
    for r in run(world, world_tokenizer, retriever, "hmas", qs, PERFECT):
        m = meta[r.question]
        subtasks = [e.text for e in r.events_of("subtask")]
        assert subtasks == [SUBTASK_ONE[m["relation"]].format(s=s) for s in m["subjects"]]
        assert exact_match(r.final_answer, r.answers)


def test_the_scripted_hierarchy_splits_pair_questions_and_beats_the_cascade(world, world_tokenizer, retriever):
    """Over 320 workflows per workflow (the 160 training pair questions twice), seeded: the Leader
    delegates two or more subtasks in most H-MAS workflows, searches more, and H-MAS answers more
    pair questions right (measured about +10 points; asserted: +4)."""
    qs = [q for q in load_split(world, "train") if q.dataset in PAIR_DATASETS]
    assert len(qs) == 640
    qs = qs[::4]   # 160 of them, both datasets
    cmas = run(world, world_tokenizer, retriever, "cmas", qs, attempts=2, seed=11)
    hmas = run(world, world_tokenizer, retriever, "hmas", qs, attempts=2, seed=11)

    def em(records):
        return sum(exact_match(r.final_answer, r.answers) for r in records) / len(records)

    first = [r.events_of("subtask") for r in hmas]
    two_or_more = sum(len(s) >= 2 for s in first) / len(hmas)
    first_wave = sum(len([e for e in s if e.step == s[0].step]) >= 2 for s in first if s) / len(hmas)
    assert two_or_more > 0.7 and first_wave > 0.65
    assert sum(r.search_actions for r in hmas) > 1.2 * sum(r.search_actions for r in cmas)
    assert em(hmas) > em(cmas) + 0.04


def leader_prompt(tok, question, outputs_and_reports):
    """A Leader's prompt after its ``outputs`` and the reports each wave brought back."""
    from mopd.rollout.chat import continuation_ids

    ids = prompts.render_leader_prompt(tok, question)
    n = 0
    for output, reports in outputs_and_reports:
        ids = ids + tok.encode(output, add_special_tokens=False) + [tok.eos_token_id]
        batch = []
        for task, text in reports:
            n += 1
            batch.append(prompts.Report(n, task, text))
        ids = ids + continuation_ids(tok, prompts.leader_feedback(batch))
    return tok.decode(ids)


def test_the_leader_re_asks_for_the_missing_band_only_then_selects(world, world_tokenizer):
    policy = world_policy(world.root, PERFECT)
    meta = load_question_meta(world)
    q = next(q for q in all_questions(world) if q.dataset == PAIR_GENRES)
    a, b = meta[q.question]["subjects"]
    one = SUBTASK_ONE["genre"]
    first = f"<subtask>{one.format(s=a)}</subtask><subtask>{one.format(s=b)}</subtask>"
    assert policy.act(leader_prompt(world_tokenizer, q.question, []), random.Random(0)) == first
    found, lost = policy._gold_sentences[a], "I found nothing about this."
    after_one = leader_prompt(world_tokenizer, q.question, [(first, [(one.format(s=a), found),
                                                                      (one.format(s=b), lost)])])
    assert policy.act(after_one, random.Random(1)) == f"<subtask>{one.format(s=b)}</subtask>"
    after_two = leader_prompt(world_tokenizer, q.question, [
        (first, [(one.format(s=a), found), (one.format(s=b), lost)]),
        (f"<subtask>{one.format(s=b)}</subtask>", [(one.format(s=b), policy._gold_sentences[b])])])
    picks = Counter(policy.act(after_two, random.Random(i)) for i in range(50))
    assert set(picks) == {"<select>1,3</select>", "<select>1,2,3</select>"}  # useful ones, or all (0.2)
    assert picks["<select>1,3</select>"] > 30


class _FixedAnswerer:
    """A stand-in model that answers every request with one text and keeps the prompts it saw."""

    def __init__(self, tok, text):
        self.tok, self.text, self.prompts = tok, text, []

    def generate(self, requests):
        from mopd.rollout.scripted_engine import completion_from_text

        self.prompts += [self.tok.decode(r.prompt_ids) for r in requests]
        return [[completion_from_text(self.tok, self.text, r.params)] * r.params.n for r in requests]


def test_answerer_only_sends_the_answerers_requests_to_the_model(world, world_tokenizer, retriever):
    """The Answerer check (bench/recipes/tiny_world/scripted_team.py --answerer): the scripted Leader and Searchers act,
    the model writes every answer and nothing else."""
    from mopd.recipes.tiny_world.policy_check import AnswererOnly

    qs = [q for q in load_split(world, "dev") if q.dataset in PAIR_DATASETS][:6]
    for wf in ("cmas", "hmas"):
        team = DemoEngine(world_policy(world.root, PERFECT), world_tokenizer, seed=5)
        model = _FixedAnswerer(world_tokenizer, "<answer>Ashford and folk</answer>")
        settings = workflow_settings(wf, temperature=1.0, top_p=1.0, seed=5)
        records = run_workflows(AnswererOnly(team, model, world_tokenizer), retriever, world_tokenizer, qs, settings,
                                attempts=2, progress=False)
        answerer_calls = sum(len(r.calls_of("answerer")) for r in records)
        assert len(model.prompts) == answerer_calls >= len(records) == 12
        assert all(prompts.ANSWERER_SYSTEM in p for p in model.prompts)
        assert all(r.final_answer == "Ashford and folk" for r in records)
        # the scripted team did the rest: every workflow searched, and the Answerer saw both bands' facts
        assert all(r.search_actions >= 2 for r in records)
        policy = world_policy(world.root, PERFECT)
        meta = load_question_meta(world)
        for q in qs:
            seen = [p for p in model.prompts if q.question in p]
            assert seen and all(policy._gold_sentences[s] in p for p in seen for s in meta[q.question]["subjects"])


def test_em_given_facts_counts_only_workflows_whose_answerer_saw_every_needed_fact(world, world_tokenizer, retriever):
    from mopd.recipes.tiny_world.policy_check import _em_given_facts

    qs = load_split(world, "dev")[::5]
    policy = world_policy(world.root, PERFECT)
    careful = run(world, world_tokenizer, retriever, "hmas", qs, PERFECT, seed=3)
    out = _em_given_facts(careful, policy, world_tokenizer)
    by_ds = Counter(q.dataset for q in qs)
    # a perfect team finds every fact (two-hop: the town's sentence too) and answers right
    assert out["given_facts"] == dict(sorted(by_ds.items())) and set(out["em_given_facts"].values()) == {1.0}
    # a team that never searches reports made-up facts: no workflow has its facts
    blind = dataclasses.replace(PERFECT, search_first=0.0)
    out = _em_given_facts(run(world, world_tokenizer, retriever, "hmas", qs, blind, seed=3), policy, world_tokenizer)
    assert out == {"em_given_facts": {}, "given_facts": {}}
    # a careless Answerer (right_pick 0) given every fact is wrong every time
    sloppy = dataclasses.replace(PERFECT, right_pick=0.0)
    out = _em_given_facts(run(world, world_tokenizer, retriever, "hmas", qs, sloppy, seed=3), policy, world_tokenizer)
    assert out["given_facts"] == dict(sorted(by_ds.items())) and set(out["em_given_facts"].values()) == {0.0}
