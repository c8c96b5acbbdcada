"""`mopd view` takes adapter directories wherever it takes models (issue 58): an evaluation of an
adapter reads its base's tokenizer, and ``--teacher ADAPTER_DIR`` (the LoRA demo's teacher) scores
the Searcher tokens as the base with that adapter merged."""

import json
import math
import shutil

import pytest

from mopd.cli import main
from mopd.view.sources import model_dir_of, open_source
from mopd.view.teacher_scores import score_searchers
from tests.helpers.adapters import write_random_adapter


@pytest.fixture(scope="module")
def adapter_dir(view_model_dir, tmp_path_factory):
    return write_random_adapter(view_model_dir, tmp_path_factory.mktemp("view_adapter") / "adapter", std=0.2)


def test_an_adapter_teacher_scores_as_its_merged_base(eval_root, view_model_dir, adapter_dir):
    wfs = list(open_source(str(eval_root / "eval" / "opd")).workflows)[:1]
    by_adapter = score_searchers([w for w in wfs], adapter_dir)[0].calls["s0.0"]["tokens"]["teacher"]
    wfs = list(open_source(str(eval_root / "eval" / "opd")).workflows)[:1]
    by_base = score_searchers([w for w in wfs], view_model_dir)[0].calls["s0.0"]["tokens"]["teacher"]
    assert len(by_adapter) == len(by_base) > 0
    assert max(abs(a - b) for a, b in zip(by_adapter, by_base)) > 1e-3        # the adapter is applied
    assert all(math.isfinite(v) for v in by_adapter)


def test_mopd_view_of_an_adapters_evaluation_with_an_adapter_teacher(eval_root, adapter_dir, tmp_path):
    out = tmp_path / "opd"
    shutil.copytree(eval_root / "eval" / "opd", out)
    (out / "run.json").write_text(json.dumps({"model": adapter_dir}))   # evaluated: the adapter
    assert model_dir_of(out) == adapter_dir
    assert main(["view", str(out), "--teacher", adapter_dir]) == 0
    page = (out / "view.html").read_text()
    data = json.loads(page.split('id="mopd-data">', 1)[1].split("</script>", 1)[0].replace("<\\/", "</"))
    assert "teacher" in data["signals"]


def test_a_broken_adapter_teacher_is_one_line(eval_root, adapter_dir, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(adapter_dir, bad)
    f = bad / "adapter_model.safetensors"
    f.write_bytes(f.read_bytes()[:40])
    assert main(["view", str(eval_root / "eval" / "opd"), "--out", str(tmp_path / "v.html"),
                 "--teacher", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "adapter_model.safetensors" in err and "Traceback" not in err
