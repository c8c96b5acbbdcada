"""Prompt rendering and token-exact continuation through the chat template."""

import pytest

from mopd.core.roles import role_of_prompt
from mopd.retriever import Passage
from mopd.rollout import prompts
from mopd.rollout.chat import ChatTemplateError, chat_format, continuation_ids, render_ids


def test_chat_format_is_cut_from_the_template(tokenizer):
    fmt = chat_format(tokenizer)
    assert fmt.turn_end == "<|im_end|>\n<|im_start|>user\n"
    assert fmt.user_suffix == "<|im_end|>\n<|im_start|>assistant\n"
    assert fmt.system_role
    assert fmt.continuation("c", ended_with="<|im_end|>") == "\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n"
    assert fmt.continuation("c").startswith("<|im_end|>\n<|im_start|>user\nc")


def test_segments_concatenate_to_the_rendered_conversation(tokenizer):
    """First prompt + model turn (with EOS) + continuation == the template's rendering of the
    whole conversation, as text; the ids are those pieces' ids, never a re-tokenisation."""
    first = prompts.render_searcher_prompt(tokenizer, "Q?")
    model = tokenizer.encode("<search>q</search>", add_special_tokens=False) + [tokenizer.eos_token_id]
    passages = [Passage("1", "Oslo", "Oslo is a city."), Passage("2", "Bergen", "Rain.")]
    content = prompts.searcher_feedback(passages)
    assert content == "<information>Doc 1(Title: Oslo) Oslo is a city.\nDoc 2(Title: Bergen) Rain.</information>"
    env = continuation_ids(tokenizer, content, after_eos=True)
    whole = prompts.searcher_messages("Q?") + [{"role": "assistant", "content": "<search>q</search>"},
                                               {"role": "user", "content": content}]
    rendered = tokenizer.apply_chat_template(whole, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(first + model + env) == rendered
    assert render_ids(tokenizer, prompts.searcher_messages("Q?")) == first


def test_information_segment_uses_the_retriever_layout():
    from mopd.retriever import Passage, format_passages

    ps = [Passage(id="7", title='"Oslo"', text="Capital.", score=1.0)]
    assert prompts.information_segment(ps) == f"<information>{format_passages(ps)}</information>"


def test_role_prompts_hold_their_inputs(tokenizer):
    def text(ids):
        return tokenizer.decode(ids)

    assert "Question: Q1?" in text(prompts.render_searcher_prompt(tokenizer, "Q1?"))
    h = text(prompts.render_searcher_prompt(tokenizer, "Q1?", subtask="find X", force_report=True,
                                            show_question=True))
    assert "Your task: find X\nIt is part of the question: Q1?" in h and prompts.FORCE_REPORT in h
    assert prompts.LEADER_SYSTEM in text(prompts.render_leader_prompt(tokenizer, "Q2?"))
    a = text(prompts.render_answerer_prompt(tokenizer, "Q3?", ["r one", "", "r three"]))
    assert f"Report 1: r one\nReport 2: {prompts.EMPTY_REPORT}\nReport 3: r three\n\nQuestion: Q3?" in a
    assert prompts.NO_REPORTS in text(prompts.render_answerer_prompt(tokenizer, "Q3?", []))


def test_feedback_contents():
    reports = [prompts.Report(1, "find X", "X is Y."), prompts.Report(2, "find Z", "")]
    fb = prompts.leader_feedback(reports, force_select=True)
    assert fb == ("Report 1 (task: find X):\nX is Y.\n\nReport 2 (task: find Z):\n(no report)\n\n"
                  + prompts.FORCE_SELECT)
    assert prompts.leader_feedback(invalid=True) == prompts.INVALID_LEADER
    assert prompts.searcher_feedback(invalid=True, force_report=True) == (
        prompts.INVALID_SEARCHER + "\n\n" + prompts.FORCE_REPORT)


def test_a_template_that_rewrites_history_is_refused(tokenizer):
    class Odd:
        eos_token = "<e>"
        chat_template = "odd"

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            return "|".join(m["role"] for m in messages) + ("|gen" if add_generation_prompt else "")

    with pytest.raises(ChatTemplateError):
        chat_format(Odd())


def test_role_of_reads_the_system_prompt(tokenizer):
    assert role_of_prompt(tokenizer.decode(prompts.render_leader_prompt(tokenizer, "Q"))) == "leader"
    assert role_of_prompt(tokenizer.decode(prompts.render_searcher_prompt(tokenizer, "Q", "s"))) == "searcher"
    assert role_of_prompt(tokenizer.decode(prompts.render_answerer_prompt(tokenizer, "Q", []))) == "answerer"
    assert role_of_prompt("no system prompt") is None


@pytest.mark.parametrize("force", [False, True])
def test_an_hmas_searcher_sees_its_subtask_as_a_cmas_searcher_sees_its_question(tokenizer, force):
    """The paper's one Searcher interface: the same ids as a C-MAS Searcher whose question is the
    subtask, and nothing of the whole question (unless the opt-in template is asked for)."""
    hmas = prompts.render_searcher_prompt(tokenizer, "Where was the band Zeta formed?", subtask="find Zeta",
                                          force_report=force)
    assert hmas == prompts.render_searcher_prompt(tokenizer, "find Zeta", force_report=force)
    assert "band Zeta formed" not in tokenizer.decode(hmas)
    opt_in = prompts.render_searcher_prompt(tokenizer, "Where was the band Zeta formed?", subtask="find Zeta",
                                            force_report=force, show_question=True)
    assert opt_in != hmas and "band Zeta formed" in tokenizer.decode(opt_in)
