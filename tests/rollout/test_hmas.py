"""H-MAS state machine, driven by a scripted engine: waves, rounds, selection and the forced paths."""

import re

from mopd.rollout import prompts
from tests.helpers.prompts import field, last_user, role_of, turn_of
from tests.helpers.workflows import check_call_layout, kinds, run_scripted


def policy(leader_turns, searcher=None, answer="<answer>a</answer>", log=None):
    """Leader says leader_turns[t-1] on its turn t (the last one repeats); Searchers follow
    ``searcher(subtask, turn)`` (default: search once, then report on the subtask)."""
    searcher = searcher or (lambda sub, t: f"<search>{sub}</search>" if t == 1 else f"<report>R({sub})</report>")

    def respond(prompt, params):
        role = role_of(prompt)
        if log is not None:
            log.append((role, prompt))
        if role == "leader":
            return leader_turns[min(turn_of(prompt), len(leader_turns)) - 1]
        if role == "searcher":
            return searcher(field(prompt, "Question"), turn_of(prompt))
        return answer
    return respond


def test_wave_of_three_then_select_a_subset(tokenizer):
    log = []
    (rec,), engine, retriever = run_scripted(
        tokenizer, policy(["<subtask>A</subtask>\n<subtask>B</subtask> <subtask>C</subtask>", "<select>1, 3</select>"],
                          log=log), workflow="hmas")
    assert [c.call_id for c in rec.calls] == ["l0", "s0.0", "s0.1", "s0.2", "a0.0"]
    assert [c.parent for c in rec.calls_of("searcher")] == ["A", "B", "C"]
    assert kinds(rec, "subtask", "search", "report", "select", "answer") == (
        ["subtask"] * 3 + ["search"] * 3 + ["report"] * 3 + ["select", "answer"])
    assert rec.events_of("select")[0].selection == [1, 3]
    # L(1) S(2: 3 searches) S(3: 3 reports) L(4) A(5); each step is one engine batch
    assert rec.steps == 5 and [len(b) for b in engine.batches] == [1, 3, 3, 1, 1]
    assert retriever.batches == [["A", "B", "C"]]
    # the Leader's call grows: subtasks, then the reports, then its select
    leader = rec.calls[0]
    assert [s.source for s in leader.segments] == ["env", "model", "env", "model"]
    reports_turn = leader.segments[2].text
    assert "Report 1 (task: A):\nR(A)" in reports_turn and "Report 3 (task: C):\nR(C)" in reports_turn
    # the Answerer reads reports 1 and 3 only, in the selected order
    answer_prompt = next(p for r, p in log if r == "answerer")
    assert "Report 1: R(A)\nReport 2: R(C)\n\nQuestion:" in answer_prompt and "R(B)" not in answer_prompt
    # the H-MAS Searcher gets its subtask where and how a C-MAS Searcher gets the question
    first_searcher = next(p for r, p in log if r == "searcher")
    assert "Question: A<|im_end|>" in first_searcher and "band 0" not in first_searcher
    assert rec.calls[1].segments[0].token_ids == prompts.render_searcher_prompt(tokenizer, "A")
    for call in rec.calls:
        check_call_layout(call, tokenizer)
    assert rec.calls[1].step == 2 and rec.calls[4].step == 5


def test_several_rounds_and_a_wave_waits_for_its_slowest_searcher(tokenizer):
    def searcher(sub, t):  # B searches three times, the others report at once
        if sub == "B" and t <= 3:
            return f"<search>B{t}</search>"
        return f"<report>R({sub})</report>"

    (rec,), engine, _ = run_scripted(
        tokenizer, policy(["<subtask>A</subtask><subtask>B</subtask>", "<subtask>C</subtask>",
                           "<select>3,1</select>"], searcher), workflow="hmas")
    # L1, wave 0: steps 2-5 (B reports at its 4th turn), L6, wave 1: step 7, L8, A9
    assert rec.steps == 9
    assert [c.call_id for c in rec.calls_of("searcher")] == ["s0.0", "s0.1", "s1.0"]
    assert [len(b) for b in engine.batches] == [1, 2, 1, 1, 1, 1, 1, 1, 1]
    assert rec.search_actions == 3
    assert rec.events_of("select")[0].selection == [3, 1]
    leader = rec.calls[0]
    assert len(leader.outputs()) == 3 and "Report 3 (task: C)" in leader.segments[4].text
    assert "Report 1" not in leader.segments[4].text  # only the new wave's reports are shown again


def test_round_limit_forces_selection_and_falls_back_to_all_reports(tokenizer):
    log = []
    (rec,), *_ = run_scripted(tokenizer, policy(["<subtask>X</subtask>"], lambda s, t: "<report>r</report>",
                                                log=log), workflow="hmas", max_rounds=2)
    leader_prompts = [p for r, p in log if r == "leader"]
    assert len(leader_prompts) == 3
    assert prompts.FORCE_SELECT in last_user(leader_prompts[2])
    assert all(prompts.FORCE_SELECT not in last_user(p) for p in leader_prompts[:2])
    # forced turn wrote a subtask anyway: invalid, and the environment selects every report
    assert kinds(rec, "subtask", "limit", "invalid", "select") == ["subtask", "subtask", ("limit", "round"),
                                                                   "invalid", "select"]
    sel = rec.events_of("select")[0]
    assert sel.selection == [1, 2] and sel.text == "fallback"
    assert rec.calls[0].invalid and len(rec.calls_of("searcher")) == 2


def test_step_limit_forces_searchers_then_the_leader(tokenizer):
    log = []
    (rec,), *_ = run_scripted(tokenizer, policy(["<subtask>X</subtask><subtask>Y</subtask>", "<select>2</select>"],
                                                lambda s, t: f"<search>{s}{t}</search>", log=log),
                              workflow="hmas", max_steps=6)
    # L1, Searchers search at 2 and 3, are forced at 4 (= max_steps-2), Leader forced at 5, A6
    assert rec.steps == 6
    limits = [(e.step, e.call_id, e.text) for e in rec.events_of("limit")]
    assert limits == [(4, "s0.0", "step"), (4, "s0.1", "step"), (5, "l0", "step")]
    # 4 searches run, and the 2 forced turns' searches count too (not run, no passages)
    assert rec.search_actions == 6 and rec.returned_passages == 4 * 3
    assert all(c.invalid for c in rec.calls_of("searcher"))
    leader_last = [p for r, p in log if r == "leader"][-1]
    assert f"Report 2 (task: Y):\n{prompts.EMPTY_REPORT}" in leader_last
    assert prompts.FORCE_SELECT in last_user(leader_last)
    assert rec.events_of("select")[0].selection == [2] and rec.events_of("select")[0].text == ""
    assert not rec.calls[0].invalid


def test_steps_never_exceed_the_limit(tokenizer):
    for max_steps in range(2, 9):
        (rec,), *_ = run_scripted(tokenizer, policy(["<subtask>X</subtask>"], lambda s, t: "<search>q</search>"),
                                  workflow="hmas", max_steps=max_steps)
        assert rec.steps <= max_steps and len(rec.candidates) == 1, max_steps


def test_no_subtask_cap_by_default(tokenizer):
    seven = "".join(f"<subtask>T{i}</subtask>" for i in range(7))
    (rec,), *_ = run_scripted(tokenizer, policy([seven, "<select>1</select>"]), workflow="hmas")
    assert [c.parent for c in rec.calls_of("searcher")] == [f"T{i}" for i in range(7)]
    assert rec.events_of("dropped_subtask") == []


def test_subtasks_beyond_a_cap_are_dropped_and_each_recorded(tokenizer):
    from mopd.algo.diagnostics import batch_diagnostics

    five = "".join(f"<subtask>T{i}</subtask>" for i in range(5))
    (rec,), *_ = run_scripted(tokenizer, policy([five, "<select>1</select>"]), workflow="hmas",
                              max_searchers_per_wave=3)
    assert [c.parent for c in rec.calls_of("searcher")] == ["T0", "T1", "T2"]
    assert len(rec.events_of("subtask")) == 3
    assert [(e.call_id, e.text) for e in rec.events_of("dropped_subtask")] == [("l0", "T3"), ("l0", "T4")]
    assert batch_diagnostics([rec, rec])["dropped_subtasks_per_workflow"] == 2.0


def test_opt_in_template_shows_the_question(tokenizer):
    log = []
    run_scripted(tokenizer, policy(["<subtask>A</subtask>", "<select>1</select>"], log=log), workflow="hmas",
                 searcher_sees_question=True)
    first_searcher = next(p for r, p in log if r == "searcher")
    assert "Your task: A\nIt is part of the question: Where was band 0 formed?" in first_searcher


def test_invalid_leader_outputs_are_re_asked(tokenizer):
    log = []
    (rec,), *_ = run_scripted(tokenizer, policy(["<select>1</select>", "<subtask>A</subtask> and more",
                                                 "<subtask>A</subtask>", "<select>2</select>", "<select>1</select>"],
                                                log=log), workflow="hmas")
    # select before any report, text outside tags, a subtask wave, an out-of-range select, a select
    assert kinds(rec, "invalid", "subtask", "select") == ["invalid", "invalid", "subtask", "invalid", "select"]
    leader_prompts = [p for r, p in log if r == "leader"]
    assert prompts.INVALID_LEADER in last_user(leader_prompts[1])
    assert prompts.INVALID_LEADER not in last_user(leader_prompts[3])  # reports shown instead
    assert prompts.INVALID_LEADER in last_user(leader_prompts[4])
    assert rec.calls[0].invalid and rec.final_answer == "a"
    check_call_layout(rec.calls[0], tokenizer)


def test_answerer_candidates_and_no_reports(tokenizer):
    log = []
    outs = ["<answer>x</answer>", "<answer>y</answer>", ""]
    (rec,), *_ = run_scripted(tokenizer, policy(["garbage"], answer=outs, log=log), workflow="hmas",
                              max_steps=4, candidates=3)
    # the Leader never delegates: forced at step 2 (= max_steps-2), fallback select of nothing
    assert rec.steps == 3 and rec.events_of("select")[0].selection == []
    assert prompts.NO_REPORTS in next(p for r, p in log if r == "answerer")
    assert rec.candidates == outs and rec.final_answer is None
    assert [c.invalid for c in rec.calls_of("answerer")] == [False, False, True]


def test_many_runs_share_each_engine_batch(tokenizer):
    recs, engine, retriever = run_scripted(
        tokenizer, policy(["<subtask>A</subtask><subtask>B</subtask>", "<select>1,2</select>"]),
        workflow="hmas", n_questions=4, attempts=2, candidates=2)
    assert len(recs) == 8 and all(r.steps == 5 for r in recs)
    assert [len(b) for b in engine.batches] == [8, 16, 16, 8, 8]
    assert [len(b) for b in retriever.batches] == [16]
    ids = [c.call_id for c in recs[0].calls]
    assert all([c.call_id for c in r.calls] == ids for r in recs)
    assert re.fullmatch(r"toy/q\d/\d/a0", recs[5].calls[-1].group)
