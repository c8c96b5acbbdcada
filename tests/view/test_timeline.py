"""A call's turns and their events: environment events go with the turn before them, none is lost."""

from mopd.view.timeline import workflow_tree


def _seg(source, text):
    return {"token_ids": [], "source": source, "text": text, "logprobs": None}


def test_environment_events_join_the_turn_before_them():
    call = {"call_id": "s0.0", "role": "searcher", "step": 2,
            "segments": [_seg("env", "prompt"), _seg("model", "<search>a</search>"), _seg("env", "info"),
                         _seg("model", "<search>b</search>"), _seg("env", "info"), _seg("model", "<report>r</report>")]}
    events = [{"kind": "search", "step": 2, "call_id": "s0.0", "text": "a"},
              {"kind": "search", "step": 4, "call_id": "s0.0", "text": "b"},      # a slow retrieval: step 3 skipped
              {"kind": "limit", "step": 5, "call_id": "s0.0", "text": "step"},    # forced to report at step 6
              {"kind": "report", "step": 6, "call_id": "s0.0", "text": "r"}]
    record = {"question_id": "q", "workflow": "hmas", "calls": [call], "events": events}
    turns = workflow_tree(record, lambda text: 0)["calls"]["s0.0"]["turns"]
    assert [t["step"] for t in turns] == [2, 4, 6]
    assert [[e["kind"] for e in t["events"]] for t in turns] == [["search"], ["search", "limit"], ["report"]]


def test_a_call_without_segments_keeps_its_events():
    call = {"call_id": "l0", "role": "leader", "step": 1}
    events = [{"kind": "subtask", "step": 1, "call_id": "l0", "text": "A"},
              {"kind": "dropped_subtask", "step": 1, "call_id": "l0", "text": "B"},
              {"kind": "select", "step": 3, "call_id": "l0", "selection": [1]}]
    tree = workflow_tree({"question_id": "q", "calls": [call], "events": events}, lambda text: 0)
    turns = tree["calls"]["l0"]["turns"]
    assert [[e["kind"] for e in t["events"]] for t in turns] == [["subtask", "dropped_subtask"], ["select"]]
    assert [b["kind"] for b in tree["blocks"]] == ["turn", "turn"]
