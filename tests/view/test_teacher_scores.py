"""`mopd view --teacher`: an evaluation's Searcher tokens scored once by a teacher, no step."""

import base64
import json
import math
import shutil
import zlib

import torch

from mopd.cli import main
from mopd.train.model import PackedCausalLM, load_causal_lm
from mopd.train.packing import build_packed_batch
from mopd.view.sources import open_source
from mopd.view.teacher_scores import score_searchers


def test_teacher_values_are_the_teachers_log_probs_of_each_searcher_token(eval_root, view_model_dir):
    system = open_source(str(eval_root / "eval" / "opd"))
    wfs = score_searchers(list(system.workflows)[:1], view_model_dir, student_dir=view_model_dir)
    calls = wfs[0].calls
    assert sorted(calls) == ["s0.0", "s0.1"]      # Searchers only
    # against a direct forward of the same model over the call's tokens
    call = next(c for c in wfs[0].record["calls"] if c["call_id"] == "s0.0")
    ids = [t for s in call["segments"] for t in s["token_ids"]]
    mask = [int(s["source"] == "model") for s in call["segments"] for _ in s["token_ids"]]
    model, _ = load_causal_lm(view_model_dir, dtype=torch.float32, device=torch.device("cpu"))
    batch = build_packed_batch([ids], [[0] * len(ids)], [[0.0] * len(ids)], [[0.0] * len(ids)])
    with torch.no_grad():
        lp = PackedCausalLM(model.eval())(batch, temperature=1.0)
    want = [float(lp[i - 1]) for i in range(1, len(ids)) if mask[i]]
    got = calls["s0.0"]["tokens"]["teacher"]
    assert len(got) == len(want) == sum(mask) and all(math.isclose(a, b, abs_tol=2e-4) for a, b in zip(got, want))
    # teacher = student here: OPD's signal is 0 on every token
    assert calls["s0.0"]["tokens"]["old"] == got


def test_records_without_token_ids_are_tokenised_for_the_teacher(eval_root, view_model_dir, tmp_path):
    src = eval_root / "eval" / "control"
    out = tmp_path / "control"
    shutil.copytree(src, out)
    rows = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    for r in rows:   # as `mopd eval run` writes them without --keep-token-ids
        for c in r["calls"]:
            for s in c["segments"]:
                s["token_ids"], s["logprobs"] = [], None
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "run.json").write_text(json.dumps({"settings": {}}))    # no student model: no OPD, teacher only
    assert main(["view", str(out), "--teacher", view_model_dir]) == 0
    page = (out / "view.html").read_text()
    data = json.loads(page.split('id="mopd-data">', 1)[1].split("</script>", 1)[0].replace("<\\/", "</"))
    assert data["signals"] == ["teacher"]
    tree = json.loads(zlib.decompress(base64.b64decode(data["trees"][0])))
    turn = tree["calls"]["s0.0"]["turns"][0]
    assert len(turn["tokens"]["values"]["teacher"]) == len(turn["tokens"]["pieces"]) > 0
    assert "tokens" not in tree["calls"]["l0"]["turns"][0]
