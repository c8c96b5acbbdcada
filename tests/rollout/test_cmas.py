"""C-MAS state machine, driven by a scripted engine: every transition of the cascade."""

from mopd.core.records import WorkflowRecord
from mopd.rollout import prompts
from tests.helpers.prompts import field, last_user, role_of, turn_of
from tests.helpers.workflows import check_call_layout, kinds, run_scripted


def searcher_then_answer(searcher_turns, answer="<answer>Town0</answer>"):
    """Searcher says searcher_turns[t-1] on its turn t; the Answerer says ``answer``."""
    def respond(prompt, params):
        if role_of(prompt) == "searcher":
            t = turn_of(prompt)
            return searcher_turns[min(t, len(searcher_turns)) - 1]
        return answer
    return respond


def test_search_then_report(tokenizer):
    (rec,), _engine, retriever = run_scripted(
        tokenizer, searcher_then_answer(["<think>find it</think><search>band 0 formed</search>",
                                         "<report>Band 0 was formed in Town0.</report>"]))
    assert kinds(rec) == ["search", "report", "answer"]
    assert rec.steps == 3 and rec.search_actions == 1 and rec.returned_passages == 3
    assert rec.candidates == ["<answer>Town0</answer>"] and rec.final_answer == "Town0"
    assert retriever.batches == [["band 0 formed"]]
    s, a = rec.calls
    assert (s.role, s.call_id, s.step, a.role, a.step) == ("searcher", "s0", 1, "answerer", 3)
    assert [seg.source for seg in s.segments] == ["env", "model", "env", "model"]
    # the search turn ended on the stop string, so the environment closes the assistant message
    info = s.segments[2].text
    assert info.startswith("<|im_end|>\n<|im_start|>user\n<information>Doc 1(Title: T0) passage 0 about band 0")
    assert info.endswith("</information><|im_end|>\n<|im_start|>assistant\n")
    assert s.outputs() == ["<think>find it</think><search>band 0 formed</search>",
                           "<report>Band 0 was formed in Town0.</report>"]
    assert "Report 1: Band 0 was formed in Town0." in a.segments[0].text
    assert not s.invalid and not a.invalid
    for call in rec.calls:
        check_call_layout(call, tokenizer)


def test_several_searches_then_forced_report_at_the_last_searcher_step(tokenizer):
    seen = []

    def respond(prompt, params):
        if role_of(prompt) == "searcher":
            t = turn_of(prompt)
            seen.append(last_user(prompt))
            return f"<search>query {t}</search>" if t < 4 else "<report>found</report>"
        return "<answer>x</answer>"

    (rec,), _engine, _retriever = run_scripted(tokenizer, respond, max_steps=5)
    assert rec.search_actions == 3 and rec.returned_passages == 9
    assert [e.text for e in rec.events_of("search")] == ["query 1", "query 2", "query 3"]
    # steps 1-3 search, step 4 = max_steps-1 is forced to report, step 5 answers
    assert prompts.FORCE_REPORT in seen[3] and all(prompts.FORCE_REPORT not in s for s in seen[:3])
    assert ("limit", "step") in kinds(rec) and rec.steps == 5
    assert kinds(rec, "report", "answer") == ["report", "answer"]
    assert not rec.calls[0].invalid


def test_step_limit_forces_report_and_an_unreported_searcher_gives_an_empty_report(tokenizer):
    answer_prompts = []

    def respond(prompt, params):
        if role_of(prompt) == "searcher":
            return "<search>again</search>"
        answer_prompts.append(prompt)
        return "<answer>x</answer>"

    (rec,), *_ = run_scripted(tokenizer, respond, max_steps=3)
    # step 1 searches, step 2 is forced and searches anyway: invalid, not run (but counted as the
    # paper's recorder counts it, with no passages), empty report
    assert kinds(rec) == ["search", ("limit", "step"), "search", "invalid", "answer"]
    assert rec.search_actions == 2 and rec.returned_passages == 3 and rec.steps == 3
    assert [len(e.passages) for e in rec.events_of("search")] == [3, 0]
    assert rec.calls[0].invalid and rec.events_of("invalid")[0].text == "<search>again</search>"
    assert f"Report 1: {prompts.EMPTY_REPORT}" in answer_prompts[0]


def test_invalid_tags_are_recorded_and_re_asked(tokenizer):
    # the search actions the paper's recorder counts in each: non-empty queries in complete tags
    bad = {"hello <search>x</search>": 1, "<search>a</search><search>b</search>": 2, "<search>  </search>": 0,
           "<report>r</report> trailing": 0, "<think>t</think>": 0, "<search>unclosed": 0}

    for text, n_search in bad.items():
        seen = []

        def respond(prompt, params, text=text, seen=seen):
            if role_of(prompt) == "searcher":
                seen.append(last_user(prompt))
                return text if turn_of(prompt) == 1 else "<report>ok</report>"
            return "<answer>x</answer>"

        (rec,), *_ = run_scripted(tokenizer, respond)
        assert kinds(rec) == ["search"] * n_search + ["invalid", "report", "answer"], text
        assert rec.search_actions == n_search and rec.returned_passages == 0
        assert rec.calls[0].invalid and rec.steps == 3
        assert seen[1].strip() == prompts.INVALID_SEARCHER
        check_call_layout(rec.calls[0], tokenizer)


def test_empty_output_is_invalid_and_the_conversation_continues_after_eos(tokenizer):
    (rec,), *_ = run_scripted(tokenizer, searcher_then_answer(["", "<report>r</report>"], answer=""))
    s, a = rec.calls
    assert s.segments[1].token_ids == [tokenizer.eos_token_id] and s.segments[1].text == ""
    # the model ended with EOS: the environment turn does not close the message again
    assert s.segments[2].text.startswith("\n<|im_start|>user\n")
    assert s.invalid and a.invalid
    assert rec.candidates == [""] and rec.final_answer is None
    assert kinds(rec) == ["invalid", "report", "answer", "invalid"]


def test_answerer_candidates_share_a_prompt_and_a_group(tokenizer):
    outs = ["<answer>Town0</answer>", "no tag", "<think>hm</think><answer>Town9</answer>", "<answer>a</answer>",
            "<answer>Town0</answer>"]

    def respond(prompt, params):
        if role_of(prompt) == "searcher":
            return "<report>r</report>"
        assert params.n == 5
        return outs

    (rec,), engine, _ = run_scripted(tokenizer, respond, candidates=5)
    answerers = rec.calls_of("answerer")
    assert [c.call_id for c in answerers] == [f"a0.{j}" for j in range(5)]
    assert len({c.group for c in answerers}) == 1 and answerers[0].group == "toy/q0/0/a0"
    assert len({tuple(c.segments[0].token_ids) for c in answerers}) == 1
    assert rec.candidates == outs and rec.final_answer == "Town0"
    assert [c.invalid for c in answerers] == [False, True, False, False, False]
    assert [e.text for e in rec.events_of("answer")] == outs
    # one engine request with n=5 for the answering step
    assert [len(b) for b in engine.batches] == [1, 1] and engine.batches[1][0].params.n == 5


def test_output_limit_is_recorded(tokenizer):
    long = "<report>" + "word " * 50 + "</report>"
    (rec,), *_ = run_scripted(tokenizer, searcher_then_answer([long, "<report>r</report>"]), max_output_tokens=8)
    s = rec.calls[0]
    assert s.finish_reasons == ["length", "stop"] and len(s.segments[1].token_ids) == 8
    assert kinds(rec) == [("limit", "output"), "invalid", "report", "answer"] and s.invalid


def _search_forever(answer_prompts):
    def respond(prompt, params):
        if role_of(prompt) == "searcher":
            return "<search>q</search>"
        answer_prompts.append(prompt)
        return "<answer>x</answer>"
    return respond


def test_over_long_input_ends_the_searcher(tokenizer):
    first = len(prompts.render_searcher_prompt(tokenizer, "Where was band 0 formed?"))
    (rec,), *_ = run_scripted(tokenizer, _search_forever([]), max_input_tokens=first + 10)
    s, a = rec.calls
    # the passages do not fit: the Searcher ends after its first turn, with no report
    assert s.truncated_input and len(s.outputs()) == 1 and len(s) <= first + 10
    assert kinds(rec) == ["search", ("limit", "input"), "answer"]
    assert rec.steps == 2 and a.step == 2 and not a.truncated_input  # the Answerer takes step 2


def test_over_long_first_prompts_are_cut_from_the_left(tokenizer):
    question = "Where was band 0 formed?"
    answerer = len(prompts.render_answerer_prompt(tokenizer, question, [""]))
    assert answerer < len(prompts.render_searcher_prompt(tokenizer, question))
    seen = []
    (rec,), *_ = run_scripted(tokenizer, _search_forever(seen), max_input_tokens=answerer - 5)
    s, a = rec.calls
    assert s.truncated_input and a.truncated_input
    assert len(s.segments[0].token_ids) == len(a.segments[0].token_ids) == answerer - 5
    assert a.input_tokens == answerer - 5
    assert a.segments[0].token_ids == prompts.render_answerer_prompt(tokenizer, question, [""])[5:]
    assert field(seen[0], "Question") == question  # the question sits last and survives the cut
    assert [(e.kind, e.call_id, e.text) for e in rec.events_of("limit")] == [
        ("limit", "s0", "input"), ("limit", "s0", "input"), ("limit", "a0", "input")]
    check_call_layout(s, tokenizer)
    check_call_layout(a, tokenizer)


def test_records_round_trip_through_json(tokenizer, tmp_path):
    from mopd.core.records import read_records, write_records

    recs, *_ = run_scripted(tokenizer, searcher_then_answer(["<search>q</search>", "<report>r</report>"]),
                            n_questions=2, attempts=2, candidates=2)
    assert [(r.question_id, r.attempt) for r in recs] == [("q0", 0), ("q0", 1), ("q1", 0), ("q1", 1)]
    write_records(tmp_path / "r.jsonl", recs)
    back = read_records(tmp_path / "r.jsonl")
    assert [r.to_dict() for r in back] == [r.to_dict() for r in recs]
    assert isinstance(back[0], WorkflowRecord) and back[0].events_of("search")[0].passages[0].title == "T0"
