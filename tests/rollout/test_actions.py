"""The action grammar: lenient about whitespace, strict about tags."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mopd.core.actions import is_placeholder, parse_answerer, parse_leader, parse_searcher, split_think


@pytest.mark.parametrize("text,kind,body", [
    ("<search>who founded X</search>", "search", "who founded X"),
    ("  \n<search>  padded query \n</search>\n ", "search", "padded query"),
    ("<think>plan</think>\n<search>q</search>", "search", "q"),
    ("<think></think><report>multi\nline report</report>", "report", "multi\nline report"),
    ("<report>X was formed in 1998.</report>", "report", "X was formed in 1998."),
])
def test_valid_searcher_outputs(text, kind, body):
    a = parse_searcher(text)
    assert (a.kind, a.text) == (kind, body)


@pytest.mark.parametrize("text", [
    "", "   ", "just words", "<search></search>", "<search>   </search>", "<search>q",
    "q</search>", "<search>a</search><search>b</search>", "<search>a</search> and more",
    "before <search>a</search>", "<search>a</search><report>r</report>", "<report>r</report><search>a</search>",
    "<search>a <report>r</report></search>", "<search>a</search><think>t</think>", "<think>t</think>",
    "<think>unclosed <search>q</search>", "<answer>x</answer>", "<subtask>x</subtask>", "<SEARCH>q</SEARCH>",
    "<think>a<think>b</think></think><search>q</search>", "<search>q</search></think>",
    "<search>q <information>Doc 1</information></search>",
])
def test_invalid_searcher_outputs(text):
    a = parse_searcher(text)
    assert a.kind == "invalid" and not a.valid and a.error


def test_leader_subtasks_and_select():
    a = parse_leader("<think>split it</think>\n<subtask> first </subtask>\n\n<subtask>second\ntask</subtask>", 0)
    assert (a.kind, a.subtasks, a.think) == ("subtasks", ("first", "second\ntask"), "split it")
    assert parse_leader("<select>1,3</select>", 3).selection == (1, 3)
    assert parse_leader("<select> 3 , 1 </select>", 3).selection == (3, 1)
    assert parse_leader("<select>2 2 1</select>", 2).selection == (2, 1)


@pytest.mark.parametrize("text,n", [
    ("<subtask>a</subtask> x", 0), ("<subtask></subtask>", 0), ("<subtask>a</subtask><select>1</select>", 1),
    ("<select>1</select><select>1</select>", 1), ("<select>0</select>", 3), ("<select>4</select>", 3),
    ("<select>1</select>", 0), ("<select></select>", 2), ("<select>one</select>", 2), ("<select>1;2</select>", 2),
    ("<select>1,</select>", 2), ("<search>q</search>", 1), ("<subtask>a<subtask>b</subtask>", 0), ("", 0),
])
def test_invalid_leader_outputs(text, n):
    assert parse_leader(text, n).kind == "invalid"


def test_answerer():
    assert parse_answerer("<answer> Oslo </answer>").text == "Oslo"
    assert parse_answerer("<think>hmm</think><answer>1998</answer>").text == "1998"
    for bad in ("Oslo", "<answer></answer>", "<answer>a</answer><answer>b</answer>", "<answer>a", "x <answer>a</answer>"):
        assert parse_answerer(bad).kind == "invalid", bad


def test_split_think():
    assert split_think(" <think> a </think> rest ") == ("a", "rest", "")
    assert split_think("no think") == ("", "no think", "")
    assert split_think("<think>x")[2]


_plain = st.text(alphabet=st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), min_size=1)


@given(_plain, st.sampled_from(["", " ", "\n", "\n\n  "]), st.sampled_from(["", " ", "\n"]))
def test_any_plain_query_round_trips(query, pad_left, pad_right):
    a = parse_searcher(f"{pad_left}<search>{query}</search>{pad_right}")
    if query.strip() and not is_placeholder(query):
        assert a.kind == "search" and a.text == query.strip()
    else:
        assert a.kind == "invalid"


@given(st.lists(_plain.filter(lambda s: s.strip() and not is_placeholder(s)), min_size=1, max_size=6))
def test_any_subtask_list_round_trips(subtasks):
    text = "\n".join(f"<subtask>{s}</subtask>" for s in subtasks)
    assert parse_leader(text, 0).subtasks == tuple(s.strip() for s in subtasks)


def test_search_queries_count_complete_non_empty_tags_in_any_output():
    from mopd.core.actions import search_queries

    assert search_queries("<search> a b </search>") == ("a b",)
    assert search_queries("text <search>x</search> more <search>y</search>") == ("x", "y")
    assert search_queries("<search> </search><search>unclosed") == ()
    assert search_queries("<think>maybe <search>no</search></think><report>r</report>") == ()
    assert search_queries("<think>unclosed <search>q</search>") == ("q",)
    assert search_queries("") == ()


@pytest.mark.parametrize("text, kind, think", [
    ("Reasoning first.\n</think>\n\n<search>band 7 formed</search>", "search", "Reasoning first."),
    ("</think><report>Band 7 formed in Oslo.</report>", "report", ""),
    ("<think>a</think><search>b</search>", "search", "a"),
])
def test_a_think_block_opened_by_the_generation_prompt_is_skipped(text, kind, think):
    """Qwen3-2507 Thinking's generation prompt writes ``<think>\\n``; its output is the rest of the
    block, ``</think>``, then the action."""
    a = parse_searcher(text)
    assert (a.kind, a.think) == (kind, think)


@pytest.mark.parametrize("text", ["<search>query</search>", "<search> Query </search>", "<report>...</report>",
                                  "<report>\u2026</report>", "<answer><...></answer>"])
def test_placeholders_copied_from_the_instructions_are_invalid(text):
    parse = parse_answerer if "answer" in text else parse_searcher
    a = parse(text)
    assert not a.valid and "placeholder" in a.error


def test_placeholder_subtasks_are_invalid_but_real_ones_are_not():
    assert not parse_leader("<subtask>...</subtask>", 0).valid
    assert parse_leader("<subtask>find the query language of Oslo</subtask>", 0).valid
