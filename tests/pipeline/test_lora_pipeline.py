"""A pipeline whose stages train LoRA adapters: Stage I exports its adapter merged (what the
evaluation reads) and alone (the Stage II arms' teacher, a view of their own base); a full
fine-tuning pipeline keeps its stages and commands."""

import json
from pathlib import Path

import pytest

from mopd.pipeline.footprint import footprint
from mopd.pipeline.run import describe, run_pipeline
from mopd.pipeline.stages import ExportStage, TrainStage, plan
from tests.pipeline.conftest import tiny_pipeline

LORA = ["model.lora.rank=4", "model.lora.alpha=8", "trainer.lr=5e-3"]


def _lora(cfg, arms: bool = True):
    cfg.stage1.overrides += LORA
    if arms:
        for arm in cfg.stage2.values():
            arm.overrides += LORA
    return cfg


def _by_key(stages):
    return {s.key: s for s in stages}


def test_a_lora_stage1_is_exported_merged_for_evaluation_and_alone_as_the_teacher(tiny_model_dir, qa_file,
                                                                                  tmp_path):
    full = tiny_pipeline(tiny_model_dir, qa_file, tmp_path / "run")
    cfg = _lora(tiny_pipeline(tiny_model_dir, qa_file, tmp_path / "run"))
    full_stages, stages = plan(full), plan(cfg)
    keys = [s.key for s in full_stages]
    assert "stage1.export_adapter" not in keys
    assert [s.key for s in stages] == keys[:2] + ["stage1.export_adapter"] + keys[2:]
    s, f = _by_key(stages), _by_key(full_stages)
    root = tmp_path / "run"
    assert s["stage1.export"].command(cfg) == f["stage1.export"].command(full) == [
        "mopd", "export", str(root / "stage1"), "--checkpoint", "best", "--out", str(root / "stage1" / "export")]
    assert s["stage1.export_adapter"].command(cfg) == [
        "mopd", "export", str(root / "stage1"), "--checkpoint", "best", "--adapter", "--out",
        str(root / "stage1" / "export_adapter")]
    assert s["stage2.mopd"].config.teacher.path == str(root / "stage1" / "export_adapter")
    assert f["stage2.mopd"].config.teacher.path == str(root / "stage1" / "export")
    assert f"teacher.path={root / 'stage1' / 'export_adapter'}" in s["stage2.mopd"].command(cfg)
    assert "model.lora.rank=4" in s["stage2.mopd"].command(cfg)
    # the arm is exported merged only; every evaluation reads a merged export or the base
    assert "stage2.mopd.export_adapter" not in s and not s["stage2.mopd.export"].adapter
    assert s["eval.c_mas_plus_rl"].model_dir == str(root / "stage1" / "export")
    assert s["eval.multiagent_opd"].model_dir == str(root / "stage2" / "export")
    # a LoRA Stage I before full fine-tuning arms: the arms still take the adapter (loaded over
    # its base, merged, as a teacher of its own)
    mixed = _by_key(plan(_lora(tiny_pipeline(tiny_model_dir, qa_file, tmp_path / "run"), arms=False)))
    assert mixed["stage2.mopd"].config.teacher.path == str(root / "stage1" / "export_adapter")
    assert not mixed["stage2.mopd"].config.model.lora.enabled


def test_the_dry_run_sizes_adapters_not_the_whole_model(tiny_model_dir, qa_file, tmp_path):
    cfg = _lora(tiny_pipeline(tiny_model_dir, qa_file, tmp_path / "run"))
    s = _by_key(plan(cfg))
    # the tiny model: hidden 32, 2 heads of 16, 2 kv heads, ffn 64, one layer; rank 4 on the seven
    # projections: 4 x (3 x (32+32) + (32+32) + 3 x (32+64)) = 4 x 544
    adapters = 4 * (4 * 64 + 3 * 96)
    assert footprint(s["stage1.export_adapter"], cfg).disk_bytes == 4 * adapters
    assert footprint(s["stage1"], cfg).disk_bytes == 2 * 12 * adapters   # 1 kept + the best, 12 B a parameter
    text = describe(cfg)
    assert "stage1.export_adapter: C-MAS + RL: export the best-validation checkpoint's adapter alone (the teacher)" \
        in text
    assert "adapter merged into the base" in text and "--adapter --out" in text


def test_the_adapter_export_has_its_own_marker(tiny_model_dir, qa_file, tmp_path):
    cfg = _lora(tiny_pipeline(tiny_model_dir, qa_file, tmp_path / "run"))
    s = _by_key(plan(cfg))
    train, merged, adapter = s["stage1"], s["stage1.export"], s["stage1.export_adapter"]
    assert isinstance(train, TrainStage) and isinstance(adapter, ExportStage)
    train.run_dir.mkdir(parents=True)
    train.mark_done()
    merged.export_dir.mkdir()
    (merged.export_dir / "config.json").write_text("{}")
    merged.mark_done()
    assert train.done() and merged.done() and not adapter.done()
    adapter.export_dir.mkdir()
    (adapter.export_dir / "config.json").write_text("{}")        # not an adapter directory
    adapter.mark_done()
    assert not adapter.done()
    (adapter.export_dir / "adapter_config.json").write_text("{}")
    assert adapter.done() and merged.done() and train.done()
    assert (train.run_dir / "DONE.export_adapter").read_text() == (train.run_dir / "DONE").read_text()
    (train.run_dir / "DONE.export_adapter").write_text(train.fingerprint() + " last")   # another checkpoint
    assert not adapter.done() and merged.done()


@pytest.mark.slow
def test_a_lora_pipeline_runs_with_stage2_scoring_its_teacher_on_its_own_base(tiny_model_dir, qa_file, tmp_path,
                                                                              monkeypatch, capfd):
    import mopd.train.teacher
    from mopd.train import lora

    loaded, views = [], []
    real_teacher, real_view = mopd.train.teacher.Teacher.__init__, lora.AdapterView.__init__

    def teacher(self, path, **kw):
        loaded.append(path)
        real_teacher(self, path, **kw)

    def view(self, policy, adapter, path):
        views.append((adapter, path))
        real_view(self, policy, adapter, path)

    monkeypatch.setattr(mopd.train.teacher.Teacher, "__init__", teacher)
    monkeypatch.setattr(lora.AdapterView, "__init__", view)
    cfg = _lora(tiny_pipeline(tiny_model_dir, qa_file, tmp_path / "run"))
    report = run_pipeline(cfg)
    root = Path(cfg.root)
    assert report.is_file()
    teacher_dir = root / "stage1" / "export_adapter"
    assert loaded == [] and views == [("teacher", str(teacher_dir))]   # no second copy of the base
    assert (teacher_dir / "adapter_config.json").is_file() and (teacher_dir / "mopd_base.json").is_file()
    assert not (teacher_dir / "config.json").exists()
    for stage in ("stage1", "stage2"):
        merged = root / stage / "export"
        assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    assert json.loads((root / "stage2" / "export" / "mopd_export.json").read_text())["step"] == 2
    for system in ("c_mas_base", "c_mas_plus_rl", "multiagent_opd"):
        assert len((root / "eval" / system / "records.jsonl").read_text().splitlines()) == 2
    # a second run reuses both of Stage I's exports and everything after them
    capfd.readouterr()
    run_pipeline(cfg)
    err = capfd.readouterr().err
    assert f"C-MAS + RL: reusing {root / 'stage1' / 'export'}, {teacher_dir}" in err
    assert "training" not in err
