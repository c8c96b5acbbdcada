"""`mopd view` on records someone else wrote (a model's outputs, a file handed over): text that
would end or comment out the page's script, lone surrogates, malformed rows and settings files,
one id naming two questions, a size bound that must hold, and a training run whose run.json
records its model as a mapping. What the browser does with such a page is in
``tests/view/test_browser.py`` (``make test-browser``)."""

import json
import random
import re
import string

import pytest

from mopd.cli import main
from mopd.eval.tables import question_link
from mopd.view.page_data import build_page_data
from mopd.view.sources import model_dir_of, open_source
from tests.helpers.records import call, record, search

HOSTILE = ["<!--<script>", "</script><script>alert(1)</script>", "<!--", "-->", "<script>", "</SCRIPT >",
           "\u2028\u2029", "a & b > c < d", "\u202eevil", "]]>", "<![CDATA[", "<\\/script>"]


def _row(qid="q1", question="Where?", final="Paris", attempt=0, dataset="nq", **fields):
    d = record(qid, attempt=attempt, candidates=[f"<answer>{final}</answer>"],
               calls=[call("l0", "leader", ["<subtask>x</subtask>"]), call("s0.0", "searcher", ["<search>q</search>"])],
               events=[search(1, "s0.0", "query " + question)]).to_dict()
    d.update(question=question, final_answer=final, dataset=dataset, **fields)
    return d


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _inlined(page_text):
    m = re.search(r'<script type="application/json" id="mopd-data">(.*?)</script>', page_text, re.S)
    assert m, "the data element is not closed where it should be"
    return m.group(1)


def _view(capsys, *argv):
    rc = main(["view", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err.strip()


def test_no_record_text_can_end_or_comment_out_the_pages_script(tmp_path, capsys):
    rng = random.Random(7)
    rows = []
    for i, h in enumerate(HOSTILE):
        noise = "".join(rng.choice(string.printable) for _ in range(rng.randrange(1, 40)))
        rows.append(_row(f"id{h}{i}", f"{noise}{h}{noise}", final=h + noise, attempt=i % 3))
    src = _write(tmp_path / "ev" / "records.jsonl", rows)
    rc, _, err = _view(capsys, src.parent)
    assert rc == 0, err
    page = (tmp_path / "ev" / "view.html").read_text(encoding="utf-8")
    data = _inlined(page)
    assert not set(data) & set("<>&\u2028\u2029")          # nothing in it means anything to an HTML parser
    parsed = json.loads(data)                              # and JSON.parse gives every text back unchanged
    assert [q[2] for q in parsed["questions"]] == [r["question"] for r in rows]
    assert [w[7] for w in parsed["workflows"]] == [r["final_answer"] for r in rows]
    # the page's own script is the one after the data, whole
    assert page.count("<script") == 2 and page.rstrip().endswith("</script>\n</body></html>".rstrip())


def test_lone_surrogates_are_replaced_not_fatal(tmp_path, capsys):
    rows = [_row("q\ud800", "a lone \ud800 high and \udfff low, a pair \ud83d\ude00", final="x\udc80")]
    src = _write(tmp_path / "records.jsonl", rows)        # json.dumps writes them as \u escapes
    assert "\\ud800" in src.read_text()
    rc, _, err = _view(capsys, src, "--out", tmp_path / "page.html", "--title", "title \udcff")
    assert rc == 0, err
    page = (tmp_path / "page.html").read_text(encoding="utf-8")     # valid UTF-8 throughout
    parsed = json.loads(_inlined(page))
    assert parsed["questions"][0][1] == "q\ufffd"
    assert parsed["questions"][0][2] == "a lone \ufffd high and \ufffd low, a pair \U0001f600"
    assert parsed["workflows"][0][7] == "x\ufffd" and "title \ufffd" in page


def test_report_links_are_percent_encoded():
    assert question_link("ds", "rate-50%") == "[rate-50%](view.html#q=ds/rate-50%25)"
    link = question_link("a/b c", "x#y|z]")
    assert link == "[x\\#y\\|z\\]](view.html#q=a%2Fb%20c/x%23y%7Cz%5D)"


MALFORMED = [
    ("records", lambda r: r.pop("question_id"), ":1: question_id: missing"),
    ("records", lambda r: r["calls"][1].pop("call_id"), ":1: calls[1].call_id: missing"),
    ("records", lambda r: r.update(answers="Paris"), ":1: answers: 'Paris' is not a list of strings"),
    ("records", lambda r: r.update(question=None), ":1: question: None is not a string"),
    ("records", lambda r: r["events"][0].update(step="3"), ":1: events[0].step: '3' is not an integer"),
    ("records", lambda r: r["calls"][0]["segments"][1].update(token_ids=["a"]),
     ":1: calls[0].segments[1].token_ids: ['a'] is not a list of integers"),
    ("records", lambda r: r.update(calls=[7]), ":1: calls[0] is 7, not an object"),
    ("traces", lambda line: line.pop("record"), ":2: record: missing"),
    ("traces", lambda line: line["record"].pop("question_id"), ":2: record.question_id: missing"),
    ("traces", lambda line: line.update(calls={"l0": {"tokens": {"old": ["x"]}}}),
     ":2: calls['l0'].tokens: {'old': ['x']} is not an object of per-token number lists"),
]


@pytest.mark.parametrize("kind,damage,said", MALFORMED)
def test_a_malformed_source_is_one_line_naming_file_line_and_field(tmp_path, capsys, kind, damage, said):
    rows = [_row("q1"), _row("q2")]
    if kind == "records":
        damage(rows[0])
        src = _write(tmp_path / "ev" / "records.jsonl", rows)
    else:
        lines = [{"step": 1, "record": r, "calls": {}} for r in rows]
        damage(lines[1])
        src = _write(tmp_path / "run" / "traces.jsonl", lines)
    rc, out, err = _view(capsys, src.parent)
    assert rc == 2 and "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"mopd view: error: {src}{said}"), err
    assert not (src.parent / "view.html").exists()


@pytest.mark.parametrize("text,said", [("{not json", "run.json: not JSON"), ("[1, 2]", "run.json: holds list, not an object"),
                                       ("null", "run.json: holds null, not an object")])
def test_a_run_json_that_is_not_an_object_is_one_line(tmp_path, capsys, text, said):
    src = _write(tmp_path / "ev" / "records.jsonl", [_row()])
    (src.parent / "run.json").write_text(text)
    rc, _, err = _view(capsys, src.parent)
    assert rc == 2 and "\n" not in err and said in err and str(src.parent) in err, err


def test_a_training_runs_run_json_names_its_model_as_a_mapping(tmp_path, capsys, tiny_model_dir):
    run = tmp_path / "run"
    rows = [_row("q1"), _row("q2")]
    for r in rows:
        for c in r["calls"]:
            for s in c["segments"]:
                s["token_ids"] = [5, 6] if s["source"] == "model" else [1, 1]
    _write(run / "traces.jsonl", [{"step": 3, "record": r, "calls": {}} for r in rows])
    (run / "run.json").write_text(json.dumps({"config": {"model.path": tiny_model_dir, "trainer.trace_every": 1},
                                              "model": {"path": tiny_model_dir, "weights": "abc"}}))
    assert model_dir_of(run) == tiny_model_dir
    system = open_source(str(run))
    assert system.decoder                               # token ids become per-token text without --tokenizer
    rc, _, err = _view(capsys, run)
    assert rc == 0, err


def test_one_id_naming_two_questions_in_two_sources_is_shown_apart(tmp_path):
    a = _write(tmp_path / "a" / "records.jsonl", [_row("q1", "Where was band 1 formed?", "Ayr"),
                                                  _row("q2", "Who?", "Bo")])
    b = _write(tmp_path / "b" / "records.jsonl", [_row("q1", "When did band 9 split?", "1999"),
                                                  _row("q2", "Who?", "Bo")])
    data = build_page_data([open_source(str(a.parent)), open_source(str(b.parent))])
    assert [q[1:3] + [q[4]] for q in data.questions] == [["q1", "Where was band 1 formed?", 1], ["q2", "Who?", 0],
                                                       ["q1", "When did band 9 split?", 1]]
    by_system = {(w[0], w[1]) for w in data.workflows}
    assert by_system == {(0, 0), (0, 1), (1, 2), (1, 1)}     # B's q1 is scored under B's question only


def test_max_mb_bounds_the_page_and_the_page_says_what_was_left_out(tmp_path, capsys):
    rng = random.Random(11)
    words = ["".join(rng.choice(string.ascii_letters) for _ in range(8)) for _ in range(2000)]
    rows = []
    for i in range(120):     # about 4 MiB of records, texts that compress poorly
        text = " ".join(rng.choice(words) for _ in range(3500))
        r = _row(f"q{i}", f"question {i} " + text[:200], final=text[:50])
        r["calls"][1]["segments"][1]["text"] = text
        rows.append(r)
    src = _write(tmp_path / "records.jsonl", rows)
    assert src.stat().st_size > 3 * 2 ** 20
    for mb in (1, 0.25):
        out = tmp_path / f"page{mb}.html"
        rc, said, err = _view(capsys, src, "--out", out, "--max-mb", mb)
        assert rc == 0, err
        assert out.stat().st_size <= mb * 2 ** 20
        page = out.read_text(encoding="utf-8")
        m = re.search(r"The last (\d+) workflows of the sources are left out", page)
        assert m and "left out" in said
        parsed = json.loads(_inlined(page))
        assert len(parsed["workflows"]) + int(m.group(1)) == 120
    rc, _, err = _view(capsys, src, "--out", tmp_path / "tiny.html", "--max-mb", 0.001)
    assert rc == 2 and "--max-mb 0.001" in err and "\n" not in err
