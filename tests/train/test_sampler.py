"""The question sampler across epoch boundaries, and the groups its steps give."""

from collections import Counter

from mopd.train.sampler import QuestionSampler


def test_steps_cover_each_epoch_once_and_resume_where_they_stopped():
    s = QuestionSampler(7, 3, seed=5)
    dealt = [s.next_indices() for _ in range(7)]          # 21 = three epochs of 7
    flat = [i for step in dealt for i in step]
    for e in range(3):
        assert sorted(flat[7 * e:7 * e + 7]) == list(range(7))
    t = QuestionSampler(7, 3, seed=5)
    for _ in range(4):
        t.next_indices()
    u = QuestionSampler(7, 3, seed=5)
    u.load_state_dict(t.state_dict())
    assert [u.next_indices() for _ in range(3)] == dealt[4:]
    # ranks split each step's questions between them
    r0, r1 = QuestionSampler(7, 4, seed=1, rank=0, world=2), QuestionSampler(7, 4, seed=1, rank=1, world=2)
    whole = QuestionSampler(7, 4, seed=1).next_indices()
    assert sorted(r0.next_indices() + r1.next_indices()) == sorted(whole)


def _step_with_a_repeat(n=5, per_step=4):
    s = QuestionSampler(n, per_step, seed=0)
    for _ in range(50):
        step = s.next_indices()
        if max(Counter(step).values()) > 1:
            return step
    raise AssertionError("no step dealt a question twice")


def test_a_question_dealt_twice_in_one_step_gives_two_groups(tiny_model_dir):
    """Across an epoch boundary a step can hold one question twice; the rollout gives each copy
    its own group id and its own samples."""
    from transformers import AutoTokenizer

    from mopd.core.qa import QAExample
    from mopd.core.roles import role_of_prompt as role_of
    from mopd.rollout.run_state import WorkflowSettings
    from mopd.rollout.scheduler import run_workflows
    from mopd.rollout.scripted_engine import ScriptedEngine

    step = _step_with_a_repeat()
    twice = next(i for i, c in Counter(step).items() if c > 1)
    questions = [QAExample(id=f"q{i}", dataset="toy", question=f"Where was band {i} formed?", answers=["x"])
                 for i in step]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    seeds = {}

    def respond(prompt, params):
        seeds.setdefault(prompt, []).append(params.seed)
        return "<report>r</report>" if role_of(prompt) == "searcher" else "<answer>x</answer>"

    class NoSearch:
        def search(self, queries, k):
            return [[] for _ in queries]

    records = run_workflows(ScriptedEngine(tok, respond), NoSearch(), tok, questions, WorkflowSettings(max_steps=3),
                            attempts=3, progress=False)
    groups = Counter(r.group_id for r in records)
    assert len(groups) == len(step) and set(groups.values()) == {3}
    copies = [r for r in records if r.question_id == f"q{twice}"]
    assert len(copies) == 6 and len({r.group_id for r in copies}) == 2
    assert sorted(r.attempt for r in copies) == [0, 0, 1, 1, 2, 2]
    assert all(r.final_answer == "x" for r in records)
    # the second copy does not replay the first copy's samples: same prompts, other seeds
    first_prompt = tok.decode(copies[0].calls[0].segments[0].token_ids)
    assert len(set(seeds[first_prompt])) == 6
