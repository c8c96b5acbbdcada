from mopd.retriever import Passage, format_passages
from mopd.retriever.passage import split_contents


def test_split_contents_keeps_newlines_in_text():
    assert split_contents("T\na\nb") == ("T", "a\nb")
    assert split_contents("only title") == ("only title", "")
    assert split_contents('"Quoted"\ntext') == ('"Quoted"', "text")


def test_passage_contents_roundtrip_and_document():
    p = Passage.from_contents(7, "Title X\nline one\nline two", 0.5)
    assert (p.id, p.title, p.text, p.score) == ("7", "Title X", "line one\nline two", 0.5)
    assert p.contents == "Title X\nline one\nline two"
    assert p.to_document() == {"id": "7", "contents": p.contents}


def test_format_passages_search_r1_layout():
    ps = [Passage("1", "Alpha", "first text", 0.9), Passage("2", "Beta", "second", 0.1)]
    assert format_passages(ps) == "Doc 1(Title: Alpha) first text\nDoc 2(Title: Beta) second"
    assert format_passages([]) == ""
    assert format_passages(ps[1:]) == "Doc 1(Title: Beta) second"
