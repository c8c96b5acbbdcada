import pytest

from mopd.core.scoring import (
    classify_failure,
    exact_match,
    extract_answer,
    flexible_extract,
    normalize_answer,
)


@pytest.mark.parametrize("raw,expected", [
    ("The Beatles", "beatles"),
    ("  A  tale of Two   Cities. ", "tale of two cities"),
    ("an apple", "apple"),
    ("Theatre and anthem", "theatre and anthem"),          # articles inside words stay
    ("THE", ""),
    ("", ""),
    ("U.S.A.", "usa"),
    ("rock-'n'-roll!", "rocknroll"),
    ("\u201cCurly\u201d quotes", "\u201ccurly\u201d quotes"),  # curly quotes are not ASCII punctuation
    ("Caf\u00e9 M\u00fcller", "caf\u00e9 m\u00fcller"),
    ("a\tb\nc", "b c"),                                    # 'a' as a word is dropped, whitespace collapses
])
def test_normalize_answer_squad(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize("text,expected", [
    ("<answer>Paris</answer>", "Paris"),
    ("<answer>Lyon</answer> wait <answer> Paris </answer>", "Paris"),   # last tag wins, stripped
    ("<think>x</think><answer>a\nb</answer>", "a\nb"),
    ("<answer>Paris", None),                                            # unclosed
    ("<Answer>Paris</Answer>", None),                                   # strict is case-sensitive
    ("", None),
    (None, None),
    ("<answer></answer>", ""),
    ("<answer><answer>inner</answer>", "<answer>inner"),                # nested: non-greedy from first open
])
def test_extract_answer_strict(text, expected):
    assert extract_answer(text) == expected


def test_exact_match_any_reference_and_none():
    assert exact_match("the Eiffel Tower", ["Eiffel tower", "x"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel tower"]) == 0.0
    assert exact_match(None, ["x"]) == 0.0
    assert exact_match("", [""]) == 1.0
    assert exact_match("Mumbai", ["Bombay", "mumbai."]) == 1.0


@pytest.mark.parametrize("text,expected", [
    ("<answer>Paris</answer>", "Paris"),                                # rule 1
    ("<ANSWER>Rome</ANSWER> and < answer >Oslo</ answer >", "Oslo"),   # rule 2, last pair
    ("reasoning... <answer> Berlin", "Berlin"),                         # rule 3
    ("<answer>" + "x" * 129, None),                                     # rule 3 too long, rule 5 has '<'
    ("<answer>two\nlines", None),                                       # rule 3 needs a single line
    ("I think.\nFinal answer: Madrid", "Madrid"),                       # rule 4
    ("Some thoughts\nanswer:   Kyoto  ", "Kyoto"),                      # rule 4, case-insensitive
    ("Answer: <b>x</b>", None),                                         # rule 4 needs plain text; rule 5 has '<'
    ("Vienna", "Vienna"),                                               # rule 5
    ("```Vienna```", None),                                             # code fence
    ("line one\nline two", None),                                       # not single line
    ("", None),
    ("y" * 128, "y" * 128),
    ("y" * 129, None),
])
def test_flexible_extract_rules(text, expected):
    assert flexible_extract(text) == expected


def test_flexible_never_overrides_strict():
    text = "<answer>A</answer>\nFinal answer: B"
    assert flexible_extract(text) == "A"


@pytest.mark.parametrize("cands,expected", [
    ([], "no_candidate"),
    (["<answer>x</answer>", "   "], "empty_candidate"),
    (["<answer>x</answer>", "Paris"], "no_valid_tag"),
    (["junk", "<answer>x</answer>"], None),
    (["<answer></answer>"], None),
])
def test_classify_failure(cands, expected):
    assert classify_failure(cands) == expected
