import json

import pytest

from mopd.core.records import (
    AgentCall,
    Event,
    Passage,
    RecordError,
    Segment,
    WorkflowRecord,
    read_records,
    write_records,
)


def make_record(attempt=0):
    searcher = AgentCall(
        call_id="s0.0", role="searcher", step=0, parent="q",
        segments=[Segment([5, 6, 7], "env", "prompt"),
                  Segment([11, 12], "model", "<search>x</search>", [-0.5, -1.25]),
                  Segment([8, 9], "env", "<information>..."),
                  Segment([13, 2], "model", "<report>r</report>", [-0.1, -0.2])],
        input_tokens=3 + 7, output_tokens=4, finish_reasons=["stop", "stop"])
    answerer = AgentCall(call_id="a0.0", role="answerer", group="q1#0:a0",
                         segments=[Segment([1, 2], "env"), Segment([3], "model", "<answer>y</answer>", [-2.0])],
                         input_tokens=2, output_tokens=1)
    return WorkflowRecord(
        question_id="q1", dataset="nq", question="Who?", answers=["y", "Y2"], attempt=attempt,
        method="cmas_rl", workflow="cmas", calls=[searcher, answerer],
        events=[Event("search", 0, "s0.0", "x", passages=[Passage("7", "Doc"), Passage("9", "Doc2")]),
                Event("search", 1, "s0.0", "   "),
                Event("report", 1, "s0.0", "r"),
                Event("answer", 2, "a0.0", "<answer>y</answer>")],
        candidates=["<answer>y</answer>"], final_answer="y", steps=3, duration_s=0.25)


def test_flattened_views_cover_model_tokens_only():
    call = make_record().calls[0]
    assert call.token_ids() == [5, 6, 7, 11, 12, 8, 9, 13, 2]
    assert call.loss_mask() == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    assert call.sampling_logprobs() == [0, 0, 0, -0.5, -1.25, 0, 0, -0.1, -0.2]
    assert call.model_text() == "<search>x</search><report>r</report>"
    assert len(call) == 9


def test_costs():
    r = make_record()
    assert r.search_actions == 1          # the empty query is not a search action
    assert r.returned_passages == 2
    assert r.input_tokens == 12 and r.output_tokens == 5
    assert [c.call_id for c in r.calls_of("answerer")] == ["a0.0"]


def test_jsonl_round_trip(tmp_path):
    recs = [make_record(0), make_record(1)]
    p = tmp_path / "r.jsonl"
    assert write_records(p, recs) == 2
    back = read_records(p)
    assert back == recs
    write_records(p, [make_record(2)], append=True)
    assert [r.attempt for r in read_records(p)] == [0, 1, 2]


def _write_line(tmp_path, d):
    p = tmp_path / "bad.jsonl"
    good = json.dumps(make_record().to_dict())
    p.write_text(good + "\n" + json.dumps(d) + "\n")
    return p


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.pop("question_id"), "question_id: missing"),
    (lambda d: d.__setitem__("attempt", "zero"), "attempt: expected an integer"),
    (lambda d: d["calls"][0].__setitem__("role", "critic"), "calls[0]"),
    (lambda d: d["calls"][0]["segments"][1].__setitem__("logprobs", [0.1]), "calls[0].segments[1]"),
    (lambda d: d["events"][0].__setitem__("kind", "explode"), "events[0]"),
    (lambda d: d.__setitem__("bogus", 1), "unknown field"),
    (lambda d: d.__setitem__("schema_version", 99), "schema_version 99"),
])
def test_malformed_record_names_file_line_and_field(tmp_path, mutate, needle):
    d = make_record().to_dict()
    mutate(d)
    p = _write_line(tmp_path, d)
    with pytest.raises(RecordError) as e:
        read_records(p)
    msg = str(e.value)
    assert f"{p}:2" in msg and needle in msg


def test_not_json_and_missing_file(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text("{not json\n")
    with pytest.raises(RecordError, match=r"x.jsonl:1: not valid JSON"):
        read_records(p)
    with pytest.raises(RecordError, match="does not exist"):
        read_records(tmp_path / "missing.jsonl")


def test_score_cli(tmp_path, capsys):
    from mopd.cli import main

    a, b, c = make_record(0), make_record(1), make_record(2)
    b.candidates = ["Final answer: Y2"]          # flexible rescues it, strict does not
    c.candidates = []
    c.dataset = "hotpotqa"
    p = tmp_path / "r.jsonl"
    write_records(p, [a, b, c])
    assert main(["score", "--records", str(p), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nq"] == {"n": 2, "strict_em": 0.5, "flexible_em": 1.0}
    assert out["hotpotqa"]["strict_em"] == 0.0
    assert out["macro"]["strict_em"] == 0.25 and out["macro"]["flexible_em"] == 0.5


def test_format_validity_counts_valid_calls_per_role_in_role_order():
    from mopd.core.records import format_validity, format_validity_line

    a, b = make_record(0), make_record(1)
    b.calls[0].invalid = True
    b.calls.append(AgentCall(call_id="l0", role="leader", invalid=True))
    assert format_validity([a, b]) == {"leader": (0, 1), "searcher": (1, 2), "answerer": (2, 2)}
    assert format_validity_line([a, b]) == ("format validity: leader 0.00 (0/1 calls), searcher 0.50 (1/2 calls), "
                                            "answerer 1.00 (2/2 calls)")
    assert format_validity_line([]) == "format validity: no calls"
