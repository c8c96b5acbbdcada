"""The viewer's data model and page writer, without a browser: trees in time order, tokens that
spell the text, values where they were traced, the size bound, and a page that loads nothing."""

import base64
import json
import random
import re
import zlib

from mopd.cli import main
from mopd.core.roles import role_names
from mopd.view.page import render_page
from mopd.view.page_data import build_page_data
from mopd.view.sources import open_source


def trees(data):
    return [json.loads(zlib.decompress(base64.b64decode(t))) for t in data.trees]


def test_a_hmas_workflow_is_a_tree_in_time_order(eval_root):
    data = build_page_data([open_source(str(eval_root / "eval" / "opd"))])
    assert len(data.workflows) == 8 and len(data.questions) == 4
    tree = trees(data)[0]
    assert [b["kind"] for b in tree["blocks"]] == ["turn", "wave", "turn", "request"]
    assert [b["step"] for b in tree["blocks"]] == sorted(b["step"] for b in tree["blocks"])
    wave = tree["blocks"][1]
    assert wave["calls"] == ["s0.0", "s0.1"]
    searcher = tree["calls"]["s0.0"]
    assert searcher["parent"] == "Where was band 0 formed?"
    search = searcher["turns"][0]["events"][0]
    assert search["kind"] == "search" and [p["title"] for p in search["passages"]] == ["T0", "T1", "T2"]
    assert searcher["turns"][1]["events"][0] == {"kind": "report", "text": "band 0 was formed in Town0"}
    # role prompts are kept once, not in every call
    assert "You are a Searcher" in data.prompts[searcher["prompt"]] and len(data.prompts) == 3
    assert tree["final"] == "Town0" and tree["correct"] is True
    # each model turn's tokens spell its text exactly (decoded with the run's tokenizer)
    turn = searcher["turns"][0]
    assert "".join(turn["tokens"]["pieces"]).startswith(turn["text"])


def test_invalid_actions_are_named_and_no_search_flagged(eval_root):
    data = build_page_data([open_source(str(eval_root / "eval" / "control"))])
    rows = {(data.questions[w[1]][1], w[2]): w for w in data.workflows}
    leader_bit = 1 << role_names().index("leader")
    assert rows[("q3", 0)][5] & leader_bit and not rows[("q0", 0)][5]
    assert rows[("q2", 0)][6] == 0 and rows[("q0", 0)][6] == 2     # searches per workflow
    assert [w[3] for w in data.workflows if data.questions[w[1]][1] == "q1"] == [0, 0]
    tree = trees(data)[data.workflows.index(rows[("q3", 0)])]
    invalid = [e for t in tree["calls"]["l0"]["turns"] for e in t["events"] if e["kind"] == "invalid"]
    assert invalid and invalid[0]["reason"] == "expected <subtask> or <select>"


def test_traced_tokens_carry_their_values(traced_run):
    data = build_page_data([open_source(str(traced_run))])
    assert data.signals == ["opd", "advantage", "teacher", "old", "sampling"]
    assert sorted({w[8] for w in data.workflows}) == [5, 10] and len(data.workflows) == 6
    tree = trees(data)[0]
    s = tree["calls"]["s0.0"]["turns"][0]["tokens"]
    n = len(s["pieces"])
    # opd = teacher - old = 1.00 (hundredths) on every Searcher token; the Leader has no teacher
    assert s["values"]["opd"] == [100] * n and s["values"]["old"] == [-50] * n
    leader = tree["calls"]["l0"]["turns"][0]["tokens"]["values"]
    assert "opd" not in leader and leader["advantage"] == [50] * len(leader["advantage"])
    assert tree["rewards"]["l0"] == {"reward": 0.5, "advantage": 0.5}


def trees_or_none(data):
    return [json.loads(zlib.decompress(base64.b64decode(t))) if t else None for t in data.trees]


def has_tokens(tree):
    return any("tokens" in t for c in tree["calls"].values() for t in c["turns"])


def test_past_the_size_bound_workflows_keep_text_then_a_list_entry_then_nothing(eval_root):
    whole = build_page_data([open_source(str(eval_root / "eval" / "opd"))])
    assert whole.with_tokens == 8 and whole.past_bound == whole.without_tree == whole.dropped == 0
    assert len(whole.as_json().encode()) <= whole.data_bytes
    rng = random.Random(3)
    seen = set()
    for budget in sorted(rng.sample(range(600, whole.data_bytes), 40)) + [whole.data_bytes]:
        data = build_page_data([open_source(str(eval_root / "eval" / "opd"))], max_bytes=budget)
        assert len(data.as_json().encode()) <= budget                     # the bound holds
        kept = trees_or_none(data)
        assert len(kept) + data.dropped == 8
        phases = [0 if t is None else 1 if not has_tokens(t) else 2 for t in kept]
        assert phases == sorted(phases, reverse=True)                     # tokens, then text, then list only
        assert phases.count(2) == data.with_tokens and phases.count(0) == data.without_tree
        assert data.past_bound == len(kept) - data.with_tokens
        seen.add((data.with_tokens > 0, data.past_bound > data.without_tree, data.without_tree > 0, data.dropped > 0))
        if 1 in phases:
            first_text = kept[phases.index(1)]
            assert first_text["calls"]["s0.0"]["turns"][0]["text"].startswith("<search>Where was band")
        if data.past_bound or data.dropped:
            note = render_page(data)
            assert (f"token texts and values kept for {data.with_tokens} of {len(kept)} workflows" in note) == \
                bool(data.past_bound)
            assert (f"The last {data.dropped} workflows of the sources are left out" in note) == bool(data.dropped)
    assert data.with_tokens == 8
    assert len({k[i] for k in seen for i in range(4)}) == 2 and len(seen) >= 4   # every phase was reached


def test_a_cmas_workflow_and_records_without_token_ids(view_tokenizer):
    from mopd.view.page_data import System, Workflow
    from tests.helpers.prompts import role_of, turn_of
    from tests.helpers.workflows import run_scripted

    def respond(prompt, params):
        if role_of(prompt) == "searcher":
            return "<search>band</search>" if turn_of(prompt) == 1 else "<report>r</report>"
        return "<answer>Town0</answer>"

    records, _, _ = run_scripted(view_tokenizer, respond, workflow="cmas")
    d = records[0].to_dict()
    for c in d["calls"]:
        for seg in c["segments"]:
            seg["token_ids"], seg["logprobs"] = [], None
    data = build_page_data([System("cmas", [Workflow(d)])])
    tree = trees(data)[0]
    assert [b["kind"] for b in tree["blocks"]] == ["call", "request"] and tree["blocks"][0]["call"] == "s0"
    assert [e["kind"] for t in tree["calls"]["s0"]["turns"] for e in t["events"]] == ["search", "report"]
    assert data.with_tokens == 0 and data.signals == []
    assert "for the 0 of 1 workflows whose records hold token ids" in render_page(data)


def test_the_page_is_self_contained(eval_root):
    page = render_page(build_page_data([open_source(str(eval_root / "eval" / "opd"))]))
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)
    assert "<script src" not in page and "<link rel=\"stylesheet\"" not in page
    assert page.count("</script>") == 2     # the data cannot close its own script element


def test_view_writes_the_page_of_an_eval_directory(eval_root, capsys):
    # the pipeline's layout: mopd view runs/demo/eval/<system>
    assert main(["view", str(eval_root / "eval" / "opd")]) == 0
    page = eval_root / "eval" / "opd" / "view.html"
    assert page.is_file() and "8 workflows of 4 questions" in capsys.readouterr().out
    out = eval_root / "compare.html"
    assert main(["view", str(eval_root / "eval" / "opd"), str(eval_root / "eval" / "control"),
                 "--out", str(out)]) == 0
    assert '"name":"opd"' in out.read_text() and '"name":"control"' in out.read_text()


def test_view_errors_are_one_line(tmp_path, eval_root, capsys):
    for argv, said in ((["view", str(tmp_path / "nothing")], "no such file"),
                       (["view", str(tmp_path)], "no records.jsonl"),
                       (["view", str(eval_root / "eval" / "opd"), str(eval_root / "eval" / "opd")], "distinct names")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1


def test_the_tokenizer_is_the_evaluated_models(tmp_path, view_model_dir):
    # `mopd eval run` names the model in run.json; the pipeline's in-process evaluation in its settings
    from mopd.view.sources import model_dir_of

    for info in ({"model": view_model_dir}, {"settings": {"model_path": view_model_dir}}):
        (tmp_path / "run.json").write_text(json.dumps(info))
        assert model_dir_of(tmp_path) == view_model_dir
    (tmp_path / "run.json").write_text(json.dumps({"settings": {"model_path": str(tmp_path / "gone")}}))
    assert model_dir_of(tmp_path) is None


def test_serve_offers_the_page_on_localhost_only(eval_root):
    import threading
    import urllib.request

    from mopd.view.serve import page_server

    assert main(["view", str(eval_root / "eval" / "opd")]) == 0
    page = eval_root / "eval" / "opd" / "view.html"
    with page_server(page, 0) as server:
        host, port = server.server_address
        assert host == "127.0.0.1"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/view.html", timeout=30) as r:
                assert r.status == 200 and r.read() == page.read_bytes()
        finally:
            server.shutdown()
