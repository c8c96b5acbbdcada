"""The evaluation loader reads what evaluation needs, as the strict loader would."""

import json

import pytest

from mopd.core.records import AgentCall, RecordError, Segment, read_records, write_records
from mopd.eval.loading import load_runs, read_eval_records
from mopd.eval.summary import summarize
from tests.helpers.eval_records import WRONG, make_record, right


def _records():
    recs = [make_record(f"q{i}", "nq" if i % 2 else "hq", a, right() if (i + a) % 3 else WRONG, workflow="hmas",
                        searches=i % 3, empty_searches=a % 2, blank_queries=1, reports=a, subtasks=i,
                        input_tokens=100 * i + a, output_tokens=7 * a, duration_s=0.5 * a)
            for i in range(6) for a in range(4)]
    recs[0].calls.append(AgentCall("a0", "answerer", segments=[Segment([1, 2, 3], "model", "x", [-0.1] * 3)],
                                   input_tokens=9, output_tokens=3))
    return recs


def test_same_summary_as_the_strict_loader(tmp_path):
    f = tmp_path / "r.jsonl"
    write_records(f, _records())
    fast, strict = read_eval_records(f), read_records(f)
    for a, b in zip(fast, strict):
        assert (a.question_id, a.dataset, a.attempt, a.answers, a.candidates, a.workflow) == \
               (b.question_id, b.dataset, b.attempt, b.answers, b.candidates, b.workflow)
        assert (a.search_actions, a.returned_passages, a.input_tokens, a.output_tokens, a.duration_s) == \
               (b.search_actions, b.returned_passages, b.input_tokens, b.output_tokens, b.duration_s)
        assert [e.kind for e in a.events] == [e.kind for e in b.events]
    assert summarize({"x": fast}, draws=50) == summarize({"x": strict}, draws=50)
    assert strict[0].calls[-1].segments and fast[0].calls[-1].segments == []  # token segments are not loaded
    assert list(load_runs([f], names=["n"])) == ["n"]


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("answers"), r"r.jsonl:2.answers: missing required field"),
    (lambda d: d.update(attempt="1"), r"r.jsonl:2.attempt: unexpected value '1'"),
    (lambda d: d.update(attempt=True), r"r.jsonl:2.attempt: unexpected value True"),
    (lambda d: d.update(schema_version=99), r"r.jsonl:2: schema_version 99 is not supported"),
    (lambda d: d["events"].append({"kind": "bogus", "step": 0}), r"r.jsonl:2: event kind must be one of"),
    (lambda d: d["calls"][0].update(input_tokens=1.5), r"r.jsonl:2.calls\[0\]: input_tokens and output_tokens"),
    (lambda d: d.update(candidates=[3]), r"r.jsonl:2.candidates: expected a list of strings"),
])
def test_errors_name_file_line_and_field(tmp_path, change, message):
    good = make_record("q", "d", 0, right(), searches=1).to_dict()
    bad = json.loads(json.dumps(good))
    change(bad)
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=message):
        read_eval_records(f)

