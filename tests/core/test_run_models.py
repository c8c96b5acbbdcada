"""RunModels: the one rule for "is this frozen model a view of the base or a copy?", the adapters'
settings against the model's real modules, and adapter directories at their edges."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mopd.config import ConfigError, resolve
from mopd.core.adapter_dir import AdapterDirError, adapter_of, is_adapter_dir, safetensors_shapes
from mopd.core.run_models import (COPY, MERGED_COPY, VIEW_ADAPTER, VIEW_BASE, RunModels, RunModelsError)
from tests.helpers.adapters import write_random_adapter
from tests.helpers.tiny_model import init_tiny_model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return str(init_tiny_model(tmp_path_factory.mktemp("base"), vocab_size=300, hidden=24, layers=1, heads=2,
                               ffn=40, seed=3))


@pytest.fixture(scope="module")
def adapter(base, tmp_path_factory):
    """An adapter directory over ``base`` written as `mopd export --adapter` writes one (rank 4)."""
    return write_random_adapter(base, tmp_path_factory.mktemp("adapters") / "adapter", rank=4,
                                targets=("q_proj", "v_proj", "down_proj"))


def models(*overrides, preset="mopd", **kw):
    return RunModels.from_config(resolve(preset, list(overrides)), **kw)


def test_the_one_rule_for_view_or_copy(base, adapter, tmp_path):
    copy_of_base = tmp_path / "same_weights"
    shutil.copytree(base, copy_of_base)
    lora = models(f"model.path={base}", "model.lora.rank=4", f"teacher.path={adapter}")
    assert [(f.role, f.kind, f.adapter_name) for f in lora.frozen] == [("teacher", VIEW_ADAPTER, "teacher"),
                                                                       ("reference", VIEW_ADAPTER, "teacher")]
    assert len(lora.adapter_views()) == 1 and lora.copies() == []        # one adapter, attached once
    # the base itself, by path or by its weights elsewhere, is a view with no adapter
    assert models(f"model.path={base}", "model.lora.rank=4", f"teacher.path={copy_of_base}").teacher.kind == VIEW_BASE
    assert models(f"model.path={base}", "model.lora.rank=4", f"teacher.path={base}").teacher.kind == VIEW_BASE
    # another model is a copy; an adapter in a full fine-tuning run is its base with the adapter merged
    other = init_tiny_model(tmp_path / "other", vocab_size=300, hidden=24, layers=1, heads=2, ffn=40, seed=9)
    assert models(f"model.path={base}", "model.lora.rank=4", f"teacher.path={other}").teacher.kind == COPY
    assert models(f"model.path={base}", f"teacher.path={adapter}").teacher.kind == MERGED_COPY
    assert models(f"model.path={base}", f"teacher.path={copy_of_base}").teacher.kind == COPY
    # a path an earlier stage will write an adapter to is planned as one, and said to be planned
    planned = models(f"model.path={base}", "model.lora.rank=4", "teacher.path=stage1_adapter",
                     planned_adapters=["stage1_adapter"])
    assert planned.teacher.kind == VIEW_ADAPTER and planned.teacher.planned
    # a Hub id that is not the base counts as a copy
    assert models(f"model.path={base}", "model.lora.rank=4", "teacher.path=Org/other").teacher.kind == COPY
    # the Stage-I preset has no frozen model; full fine-tuning has no adapters
    assert models(f"model.path={base}", preset="cmas_rl").frozen == () and not models(
        f"model.path={base}").trains_adapters


@pytest.mark.parametrize("targets, needle", [
    ("[q_proj,v_proj,down_prj]", "down_prj matches no module of the model (closest: down_proj"),
    ("[c_attn]", "c_attn matches no module"),
    ("[embed_tokens]", "embed_tokens is tied to the lm head"),
])
def test_target_modules_are_checked_against_the_model(base, targets, needle):
    m = models(f"model.path={base}", "model.lora.rank=4", f"model.lora.target_modules={targets}", preset="cmas_rl")
    with pytest.raises(RunModelsError) as e:
        m.check()
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_all_linear_mixed_with_names_and_a_rank_over_a_layers_width_are_one_line(base):
    with pytest.raises(ConfigError, match="all-linear already names every linear layer"):
        resolve("cmas_rl", ["model.lora.rank=4", "model.lora.target_modules=[all-linear,q_proj]"])
    m = models(f"model.path={base}", "model.lora.rank=25", preset="cmas_rl")   # hidden 24
    with pytest.raises(RunModelsError, match=r"model.lora.rank=25 is over the width of .* \(24\)"):
        m.check()
    models(f"model.path={base}", "model.lora.rank=24", "model.lora.target_modules=[all-linear]",
           preset="cmas_rl").check()


def test_an_adapter_records_its_base_resolved_with_its_weights(base, adapter):
    recorded = json.loads((open(f"{adapter}/mopd_base.json")).read())
    from mopd.core.fingerprint import model_fingerprint

    assert recorded == {"path": model_fingerprint(base)["path"], "weights": model_fingerprint(base)["weights"]}
    assert adapter_of(adapter).base_path == recorded["path"]


def _broken(adapter, tmp_path, name):
    out = tmp_path / name
    shutil.copytree(adapter, out)
    return out


def test_broken_adapter_directories_are_one_line_naming_the_file(base, adapter, tmp_path):
    # a cut safetensors file
    cut = _broken(adapter, tmp_path, "cut")
    f = cut / "adapter_model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(AdapterDirError, match="adapter_model.safetensors cannot be read .*it is cut or damaged"):
        adapter_of(str(cut))
    # tensors that do not fit the config's rank
    wrong = _broken(adapter, tmp_path, "wrong_rank")
    conf = json.loads((wrong / "adapter_config.json").read_text())
    conf["r"] = 8
    (wrong / "adapter_config.json").write_text(json.dumps(conf))
    with pytest.raises(AdapterDirError, match=r"does not fit rank r=8"):
        adapter_of(str(wrong))
    assert (4, 24) in set(safetensors_shapes(Path(adapter) / "adapter_model.safetensors").values())
    # a base's config.json copied in beside the adapter does not make it a model
    copied = _broken(adapter, tmp_path, "with_config")
    shutil.copy(f"{base}/config.json", copied / "config.json")
    assert is_adapter_dir(str(copied)) and adapter_of(str(copied)) is not None
    m = models(f"model.path={base}", "model.lora.rank=4", f"teacher.path={cut}")
    with pytest.raises(RunModelsError, match="teacher.path: .*it is cut or damaged"):
        m.check()


def test_an_adapter_over_other_base_weights_is_refused(adapter, tmp_path):
    other = init_tiny_model(tmp_path / "other", vocab_size=300, hidden=24, layers=1, heads=2, ffn=40, seed=9)
    m = models(f"model.path={other}", "model.lora.rank=4", f"teacher.path={adapter}")
    with pytest.raises(RunModelsError, match="is an adapter over another base model"):
        m.check()


def test_a_hub_id_base_is_resolved_through_the_local_cache_and_recorded_as_the_id(base, adapter, tmp_path,
                                                                                    monkeypatch):
    from mopd.core.adapter_dir import resolve_base_dir
    from mopd.core.fingerprint import model_fingerprint

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--Org--Tiny"
    shutil.copytree(base, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    m = models("model.path=Org/Tiny", "model.lora.rank=4", preset="cmas_rl")
    assert resolve_base_dir("Org/Tiny") == repo / "snapshots" / "abc123"
    assert m.base_record == {"path": "Org/Tiny", "weights": model_fingerprint(base)["weights"]}
    assert models("model.path=Org/Missing", "model.lora.rank=4", preset="cmas_rl").base_record["weights"] is None
    # an adapter over the Hub id's weights is a view of it; one over other weights is refused
    hub_run = models("model.path=Org/Tiny", "model.lora.rank=4", f"teacher.path={adapter}")
    assert hub_run.teacher.kind == VIEW_ADAPTER
    hub_run.check()
    # an adapter that records the Hub id (as a run over Org/Tiny writes it) loads from the cache
    over_hub = tmp_path / "over_hub"
    shutil.copytree(adapter, over_hub)
    (over_hub / "mopd_base.json").write_text(json.dumps(m.base_record))
    found = adapter_of(str(over_hub))
    assert found.base_path == "Org/Tiny" and found.base_dir == str(repo / "snapshots" / "abc123")
    from mopd.core.adapter_dir import tokenizer_dir
    from mopd.core.model_dir import model_dir_problem

    assert model_dir_problem(found.base_dir) is None and tokenizer_dir(str(over_hub)) == found.base_dir
