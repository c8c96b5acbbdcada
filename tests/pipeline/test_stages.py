"""The stages of a pipeline: their order, their commands (which resolve the configs the stages
fingerprint), the Stage II teacher rule, and the markers that say a stage is done."""

from pathlib import Path

from mopd.config import identity_yaml, resolve, to_yaml
from mopd.pipeline.presets import resolve_pipeline
from mopd.pipeline.stages import EvalStage, ExportStage, ReportStage, TrainStage, plan


def _by_key(stages):
    return {s.key: s for s in stages}


def test_the_papers_stages_in_order_with_their_commands():
    cfg = resolve_pipeline("paper")
    stages = plan(cfg)
    assert [s.key for s in stages] == [
        "stage1", "stage1.export", "stage2.mopd", "stage2.mopd.export", "stage2.prompted_critic",
        "stage2.prompted_critic.export", "eval.c_mas_base", "eval.c_mas_plus_rl", "eval.h_mas_base",
        "eval.prompted_critic", "eval.multiagent_opd", "report"]
    s = _by_key(stages)
    one = s["stage1"].command(cfg)
    assert one[:8] == ["torchrun", "--nproc_per_node", "8", "-m", "mopd", "train", "--resume-or-start", "cmas_rl"]
    for o in ("model.path=Qwen/Qwen3-4B-Instruct-2507", "data.train=splits/train.jsonl", "data.dev=splits/dev.jsonl",
              "retriever.kind=http", "retriever.url=http://127.0.0.1:8000", "trainer.out_dir=runs/paper/stage1",
              "rollout.engine=vllm"):
        assert o in one
    assert "teacher.path=runs/paper/stage1/export" in s["stage2.mopd"].command(cfg)
    assert s["stage1.export"].command(cfg) == ["mopd", "export", "runs/paper/stage1", "--checkpoint", "best", "--out",
                                               "runs/paper/stage1/export"]
    ev = s["eval.multiagent_opd"].command(cfg)
    assert ev[:18] == ["torchrun", "--nproc_per_node", "8", "-m",     # data-parallel: one rank a GPU
                       "mopd", "eval", "run", "--model", "runs/paper/stage2/export", "--workflow", "hmas", "--manifest",
                       "splits/test.jsonl", "--attempts", "4", "--out", "runs/paper/eval/multiagent_opd", "--method"]
    assert "--preset" in ev and "hmas_base" in ev and "rollout.engine=vllm" in ev and "retriever.kind=http" in ev
    rep = s["report"].command(cfg)
    assert rep[:3] == ["mopd", "eval", "report"] and rep[rep.index("--reference") + 1] == "MultiAgent-OPD"
    assert rep[rep.index("--names") + 1:rep.index("--names") + 6] == [x.name for x in cfg.systems]


def test_each_training_command_resolves_the_config_its_stage_fingerprints():
    cfg = resolve_pipeline("paper", ["overrides=[trainer.lr=2e-6]", "stage2.mopd.steps=40"])
    for st in plan(cfg):
        if isinstance(st, TrainStage):
            words = st.command(cfg)
            start = words.index("--resume-or-start")
            assert to_yaml(resolve(words[start + 1], words[start + 2:])) == to_yaml(st.config)
            assert st.config.trainer.lr == 2e-6
    assert _by_key(plan(cfg))["stage2.mopd"].config.trainer.steps == 40


def test_stage2_distils_from_stage1_and_base_teacher_from_the_base_model():
    cfg = resolve_pipeline("paper", ["stage2.prompted_critic.preset=base_teacher"])
    s = _by_key(plan(cfg))
    assert s["stage2.mopd"].config.teacher.path == "runs/paper/stage1/export"
    bt = s["stage2.prompted_critic"].config
    assert bt.teacher.path == "Qwen/Qwen3-4B-Instruct-2507" and bt.reference_path() == "runs/paper/stage1/export"


def test_an_evaluation_takes_the_workflow_limits_of_its_training_stage():
    cfg = resolve_pipeline("paper", ["stage1.overrides=[rollout.max_steps=3]",
                                     "stage2.mopd.overrides=[rollout.max_rounds=2,rollout.searcher_sees_question=true]"])
    s = _by_key(plan(cfg))
    assert s["eval.c_mas_base"].config.rollout.max_steps == 3 and s["eval.c_mas_base"].config.rollout.workflow == "cmas"
    hmas = s["eval.h_mas_base"].config.rollout
    assert hmas.max_rounds == 2 and hmas.searcher_sees_question is True and hmas.workflow == "hmas"
    assert s["eval.h_mas_base"].config.eval.attempts == 4


def test_markers_say_which_stages_are_done(tiny):
    stages = plan(tiny)
    s = _by_key(stages)
    train, export, ev, report = s["stage1"], s["stage1.export"], s["eval.c_mas_base"], s["report"]
    assert not any(st.done() for st in stages)
    train.run_dir.mkdir(parents=True)
    train.mark_done()
    assert train.done() and not export.done()
    (export.export_dir).mkdir()
    (export.export_dir / "config.json").write_text("{}")
    export.mark_done()
    assert train.done() and export.done()
    train.begin(log=print)
    assert train.done() and export.done()
    (train.run_dir / ".stage").write_text("a build of another teacher")
    assert not train.done() and not export.done()
    train.begin(log=print)                                    # moved aside, started afresh
    assert (train.run_dir.parent / "stage1.replaced-1" / "export" / "config.json").is_file()
    assert not train.done() and sorted(p.name for p in train.run_dir.iterdir()) == [".stage"]
    (train.run_dir / "DONE").write_text(train.fingerprint().replace(" ", "0 ", 1) + " best")   # other steps
    assert not train.done() and not export.done()
    ev.out.mkdir(parents=True)
    (ev.out / "records.jsonl").write_text("")
    ev.mark_done()
    assert ev.done()
    Path(tiny.model, "extra.safetensors").write_bytes(b"other weights")   # another base model: evaluated again
    try:
        assert not ev.done()
    finally:
        Path(tiny.model, "extra.safetensors").unlink()
    assert isinstance(report, ReportStage) and not report.done()
    assert isinstance(export, ExportStage) and isinstance(ev, EvalStage)


def test_tracing_settings_leave_a_stage_fingerprint_alone():
    # tracing only writes traces.jsonl: a finished stage is reused whatever trace_every is, and a
    # fingerprint written before the setting existed (its lines absent from the config) still matches
    import hashlib

    from mopd.pipeline.stages import stage_fingerprint

    base = resolve("tiny_mopd")
    other = resolve("tiny_mopd", ["trainer.trace_every=1", "trainer.trace_workflows=9"])
    assert stage_fingerprint(base) == stage_fingerprint(other)
    text = "".join(x for x in identity_yaml(base).splitlines(keepends=True) if "trace_" not in x)
    assert stage_fingerprint(base) == f"20 {hashlib.sha256(text.encode()).hexdigest()[:16]}"
    assert stage_fingerprint(resolve("tiny_mopd", ["trainer.lr=1e-4"])) != stage_fingerprint(base)


def test_settings_added_at_their_old_value_leave_a_stage_fingerprint_alone():
    # the KL in the reward was k1 before its estimator was a setting (reward.kl_type): at k1 the
    # setting is not in the fingerprint, so stages finished before it existed are reused
    from mopd.pipeline.stages import stage_fingerprint

    base = resolve("tiny_mopd")
    assert "kl_type: k1" in to_yaml(base) and "\n  kl_type:" not in identity_yaml(base)
    assert stage_fingerprint(resolve("tiny_mopd", ["reward.kl_type=k3"])) != stage_fingerprint(base)
