"""LoRA (``model.lora``): one frozen base, the student's adapter trained, the teacher and the reference
as views of the same base; checkpoints of the adapter alone that resume exactly; merged and
adapter-only exports; the refusals a user meets. On the tiny model, with scripted policies whose
Searchers search, so that the teacher really scores Searcher tokens (OPD)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mopd.config import ConfigError, resolve
from mopd.config.inputs import LoraConfig
from mopd.core.fingerprint import model_fingerprint
from mopd.core.roles import role_of_prompt
from mopd.rollout.scripted_engine import ScriptedEngine
from mopd.train import lora
from mopd.train.model import ModelLoadError, PackedCausalLM, load_causal_lm
from mopd.train.packing import build_packed_batch
from mopd.train.teacher import Teacher
from mopd.train.trainer import PolicyTrainer
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.scripted_hmas import hmas_policy
from tests.helpers.tiny_model import init_tiny_model
from tests.helpers.training import tiny_overrides

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CPU = torch.device("cpu")
RANK = 4
VOLATILE = ("time", "perf/", "rollout/wall_s", "rollout/busy_fraction", "rollout/mean_batch_rows",
            "rollout/retrieval_wait_s", "rollout/retrieval_busy_s", "rollout/tokens_per_s/")


def cascade_policy(prompt, params):
    """Stage I: the Searcher searches once and reports; the Answerer's candidates are right or wrong
    by a draw of torch's global RNG (so that a resume that lost an RNG state would diverge)."""
    i = int(re.findall(r"band (\d+)", prompt)[0])
    if role_of_prompt(prompt) == "searcher":
        return f"<search>band {i}</search>" if prompt.count("<|im_start|>assistant") == 1 else "<report>a town</report>"
    picks = torch.randint(0, 2, (params.n,)).tolist()
    return [f"<answer>Town{i}</answer>" if p else "<answer>nowhere</answer>" for p in picks]


def lora_trainer(preset, model_dir, qa_file, out, resume=False, **extra):
    settings = {"model.lora.rank": RANK, "model.lora.alpha": 8, "rollout.max_output_tokens": 200,
                "trainer.lr": 5e-2, **extra}
    t = PolicyTrainer(resolve(preset, tiny_overrides(model_dir, qa_file, out, **settings)),
                      retriever=FakeRetriever(), resume=resume, progress=False)
    t.engine = ScriptedEngine(t.tokenizer, cascade_policy if preset == "cmas_rl" else hmas_policy("opd"),
                              record_batches=False)
    return t


def base_params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if ".lora_" not in k}


def some_batch(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (9, 4, 13)]
    z = [[0.0] * len(s) for s in seqs]
    return build_packed_batch(seqs, [[0] * len(s) for s in seqs], z, z)


@pytest.fixture(scope="module")
def stage1(tiny_model_dir, qa_file, tmp_path_factory):
    """A LoRA Stage I of two steps, exported merged and as its adapter; the adapter model's
    log-probs on a batch (the reference for both exports)."""
    root = tmp_path_factory.mktemp("lora_stage1")
    t = lora_trainer("cmas_rl", tiny_model_dir, qa_file, root / "run", **{"trainer.checkpoint_every": 1})
    before = base_params(t.model)
    init = lora.adapter_state_dict(t.model)
    t.fit(2)
    batch = some_batch(t.model.config.vocab_size)
    with torch.no_grad():
        logp = t.policy(batch)
    t.export(root / "merged", which="last")
    t.export(root / "adapter", which="last", adapter=True)
    out = {"root": root, "before": before, "after": base_params(t.model), "init": init,
           "trained": lora.adapter_state_dict(t.model), "batch": batch, "logp": logp,
           "trainable": sorted(n for n, p in t.model.named_parameters() if p.requires_grad),
           "optim_params": sum(len(g["params"]) for g in t.optimizer.param_groups)}
    t.close()
    return out


def test_lora_trains_the_adapters_alone_and_checkpoints_only_them(stage1, tiny_model_dir):
    assert stage1["before"].keys() == stage1["after"].keys()
    for k, v in stage1["before"].items():   # the base, bit for bit
        assert torch.equal(v, stage1["after"][k]), k
    assert stage1["trainable"] and all(".lora_" in n and ".default." in n for n in stage1["trainable"])
    assert stage1["optim_params"] == len(stage1["trainable"])   # AdamW holds the adapters only
    moved = [k for k in stage1["trained"] if not torch.equal(stage1["trained"][k], stage1["init"][k])]
    assert any("lora_B" in k for k in moved) and any("lora_A" in k for k in moved)
    ckpt_dir = stage1["root"] / "run" / "checkpoints" / "step_000002"
    state = json.loads((ckpt_dir / "trainer_state.json").read_text())
    assert state["lora"]["rank"] == RANK
    from mopd.train.safe_load import read_dcp_metadata

    saved = {k[len("model."):] for k in read_dcp_metadata(ckpt_dir).state_dict_metadata if k.startswith("model.")}
    assert saved == set(stage1["trainable"])   # the adapters (and their AdamW moments), never the base


def test_the_merged_export_is_a_plain_model_with_the_adapter_models_log_probs(stage1):
    merged = stage1["root"] / "merged"
    assert not (merged / "adapter_config.json").exists()
    model, _ = load_causal_lm(str(merged), dtype=torch.float32, device=CPU)
    assert not lora.is_adapted(model)
    with torch.no_grad():
        got = PackedCausalLM(model)(stage1["batch"])
    torch.testing.assert_close(got, stage1["logp"], rtol=0, atol=1e-5)


def test_the_adapter_export_is_peft_format_over_the_base_fingerprint(stage1, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = stage1["root"] / "adapter"
    base = json.loads((adapter / "mopd_base.json").read_text())
    assert base["weights"] == model_fingerprint(tiny_model_dir)["weights"]
    assert base["path"] == str(Path(tiny_model_dir).resolve())   # resolved: usable from any directory
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(adapter))
    with torch.no_grad():
        got = PackedCausalLM(peft_model.base_model.model)(stage1["batch"])
    torch.testing.assert_close(got, stage1["logp"], rtol=0, atol=1e-6)


def test_mopd_export_of_a_lora_checkpoint_merged_and_adapter(stage1, tmp_path):
    from mopd.core.errors import UserError
    from mopd.train.export import export_checkpoint

    run = stage1["root"] / "run"
    export_checkpoint(run, tmp_path / "merged", which="2")
    export_checkpoint(run, tmp_path / "adapter", which="2", adapter=True)
    model, _ = load_causal_lm(str(tmp_path / "merged"), dtype=torch.float32, device=CPU)
    with torch.no_grad():
        merged = PackedCausalLM(model)(stage1["batch"])
    torch.testing.assert_close(merged, stage1["logp"], rtol=0, atol=1e-5)
    model, _ = load_causal_lm(str(tmp_path / "adapter"), dtype=torch.float32, device=CPU)   # base + adapter, merged
    with torch.no_grad():
        torch.testing.assert_close(PackedCausalLM(model)(stage1["batch"]), stage1["logp"], rtol=0, atol=1e-5)
    # a full fine-tuning run has no adapter; a base that is not there: each one line from the command
    from mopd.train import checkpoint as ckpt
    from mopd.train.commands import _export

    full, _ = load_causal_lm(str(tmp_path / "merged"), dtype=torch.float32, device=CPU)
    ckpt.save_checkpoint(tmp_path / "full", 1, full, torch.optim.AdamW(full.parameters()),
                         {"model_path": str(tmp_path / "merged")})
    other = init_tiny_model(tmp_path / "other", vocab_size=400, hidden=32, layers=1, heads=2, ffn=64, seed=7)
    for path, base, words in ((tmp_path / "full", None, "trained all weights (no LoRA)"),
                              (run, str(tmp_path / "nowhere"), "nowhere"),
                              (run, str(other), "trained LoRA adapters over another base")):
        args = type("Args", (), {"checkpoint": str(path), "out": str(tmp_path / "x"), "adapter": True, "which": "latest",
                                 "base_model": base, "repair": False, "trust_remote_code": False})
        with pytest.raises(UserError) as e:
            _export(args)
        assert words in str(e.value) and "\n" not in str(e.value)


def test_the_adapter_teacher_scores_as_the_merged_teacher_and_the_base_view_as_the_base(stage1, tiny_model_dir,
                                                                                       qa_file, tmp_path):
    adapter = str(stage1["root"] / "adapter")
    t = lora_trainer("mopd", tiny_model_dir, qa_file, tmp_path / "s2", **{"teacher.path": adapter})
    try:
        teacher, reference = t.frozen
        assert isinstance(teacher, lora.AdapterView) and teacher.adapter == "teacher" and reference is teacher
        t.fit(1)   # the student's adapter moves; the teacher's must not
        batch = stage1["batch"]
        merged = Teacher(str(stage1["root"] / "merged"), student_tokenizer=t.tokenizer, device=CPU)
        torch.testing.assert_close(teacher.logprobs(batch), merged.logprobs(batch), rtol=0, atol=1e-5)
        with torch.no_grad():
            student = t.policy(batch)
        assert not torch.allclose(student, merged.logprobs(batch), atol=1e-4)   # the view is not the student
        base = Teacher(tiny_model_dir, student_tokenizer=t.tokenizer, device=CPU)
        assert torch.equal(lora.AdapterView(t.policy, None, tiny_model_dir).logprobs(batch), base.logprobs(batch))
        assert all(p.requires_grad == (".default." in n) for n, p in t.model.named_parameters() if ".lora_" in n)
    finally:
        t.close()


def test_base_teacher_with_lora_is_the_base_view_and_loads_no_copy(stage1, tiny_model_dir, qa_file, tmp_path):
    t = lora_trainer("base_teacher", tiny_model_dir, qa_file, tmp_path / "bt",
                     **{"teacher.path": tiny_model_dir, "reference.path": str(stage1["root"] / "adapter")})
    try:
        teacher, reference = t.frozen
        assert isinstance(teacher, lora.AdapterView) and teacher.adapter is None
        assert isinstance(reference, lora.AdapterView) and reference.adapter == "reference"
        m = t.fit(1)
        assert m["loss/skipped_updates"] == 0.0
    finally:
        t.close()


def finished(t) -> dict:
    rows = [{k: v for k, v in json.loads(x).items() if not k.startswith(VOLATILE)}
            for x in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"weights": {k: v.detach().clone() for k, v in t.model.state_dict().items()},
            "optimizer": {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
                          for i, s in t.optimizer.state_dict()["state"].items()},
            "metrics": rows, "step": t.step}


@pytest.mark.slow
def test_two_steps_and_resume_to_three_equal_three_straight_steps(stage1, tiny_model_dir, qa_file, tmp_path):
    extra = {"teacher.path": str(stage1["root"] / "adapter"), "trainer.steps": 3, "trainer.checkpoint_every": 1}
    straight = lora_trainer("mopd", tiny_model_dir, qa_file, tmp_path / "straight", **extra)
    straight.fit(3)
    a = finished(straight)
    straight.close()
    first = lora_trainer("mopd", tiny_model_dir, qa_file, tmp_path / "cut", **extra)
    first.fit(2)
    first.close()
    again = lora_trainer("mopd", tiny_model_dir, qa_file, tmp_path / "cut", resume=True, **extra)
    assert again.step == 2
    again.fit(3)
    b = finished(again)
    again.close()
    assert a["step"] == b["step"] == 3 and a["metrics"] == b["metrics"]
    for k in a["weights"]:
        assert torch.equal(a["weights"][k], b["weights"][k]), k
    for i in a["optimizer"]:
        for k, v in a["optimizer"][i].items():
            assert torch.equal(v, b["optimizer"][i][k]) if torch.is_tensor(v) else v == b["optimizer"][i][k]


def test_an_adapter_over_another_base_is_refused_in_one_line(stage1, tiny_model_dir, qa_file, tmp_path):
    other = init_tiny_model(tmp_path / "other", vocab_size=400, hidden=32, layers=1, heads=2, ffn=64, seed=7)
    with pytest.raises(ModelLoadError) as e:
        lora_trainer("mopd", str(other), qa_file, tmp_path / "s2", **{"teacher.path": str(stage1["root"] / "adapter")})
    line = str(e.value)
    assert "\n" not in line and "another base model" in line and "teacher.path" in line


def test_a_full_run_cannot_resume_a_lora_checkpoint(stage1, tiny_model_dir, qa_file):
    from mopd.train import checkpoint as ckpt

    model, _ = load_causal_lm(tiny_model_dir, dtype=torch.float32, device=CPU)
    reason = ckpt.checkpoint_mismatch(stage1["root"] / "run" / "checkpoints" / "step_000002", model)
    assert reason == ("it holds LoRA adapters only but this run trains all weights (model.lora.rank=0)")


def test_an_adapter_teacher_for_a_full_fine_tuning_run_loads_merged(stage1, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    t = Teacher(str(stage1["root"] / "adapter"), student_tokenizer=tok, device=CPU)
    assert not lora.is_adapted(t.model)
    torch.testing.assert_close(t.logprobs(stage1["batch"]), stage1["logp"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("override, words", [
    (["model.lora.rank=4", "model.lora.target_modules=[q_proj,lm_head]"], "lm_head cannot take an adapter"),
    (["model.lora.rank=-1"], "model.lora.rank"),
    (["model.lora.rank=4", "model.lora.dropout=1.5"], "model.lora.dropout"),
])
def test_bad_lora_settings_are_one_line(override, words):
    with pytest.raises(ConfigError) as e:
        resolve("cmas_rl", override)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_target_modules_the_model_lacks_are_one_line(tiny_model_dir, qa_file, tmp_path):
    with pytest.raises(ModelLoadError) as e:
        lora_trainer("cmas_rl", tiny_model_dir, qa_file, tmp_path / "r", **{"model.lora.target_modules": "[c_attn]"})
    assert "model.lora.target_modules=c_attn" in str(e.value) and "\n" not in str(e.value)


def test_lora_off_keeps_every_parameter_trainable_and_the_config_identity_unchanged(tiny_model_dir, qa_file,
                                                                                   tmp_path):
    from mopd.pipeline.stages import fingerprinted_yaml
    from mopd.train.run_dir import _comparable, run_identity

    cfg = resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path / "r"))
    assert "\n  lora:" not in fingerprinted_yaml(cfg)   # stage fingerprints of earlier pipelines still match
    assert not any(k.startswith("model.lora") for k in _comparable(run_identity(cfg)))
    on = resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path / "r", **{"model.lora.rank": 8}))
    assert "\n  lora:" in fingerprinted_yaml(on) and _comparable(run_identity(on))["model.lora.rank"] == 8


def test_merged_streaming_equals_the_merged_export(stage1, tiny_model_dir):
    from mopd.train.weight_sync import merged_parameters

    model, _ = load_causal_lm(tiny_model_dir, dtype=torch.float32, device=CPU)
    lora.add_adapters(model, LoraConfig(rank=RANK, alpha=8), tiny_model_dir)
    lora.load_frozen_adapter(model, str(stage1["root"] / "adapter"), "x")   # a second adapter is not merged
    from peft.functional import set_peft_model_state_dict

    set_peft_model_state_dict(model, {k[len("base_model.model."):]: v for k, v in stage1["trained"].items()})
    streamed = dict(merged_parameters(model, torch.float32))
    merged, _ = load_causal_lm(str(stage1["root"] / "merged"), dtype=torch.float32, device=CPU)
    want = {k: v for k, v in merged.named_parameters()}
    assert sorted(streamed) == sorted(want)
    for k, v in want.items():
        torch.testing.assert_close(streamed[k], v, rtol=0, atol=1e-6)


WORKER = Path(__file__).parent / "lora_dist_worker.py"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fp32", "mixed"])
def test_two_ranks_under_gloo_agree_with_one(mode, tiny_model_dir, stage1, tmp_path):
    from tests.train.test_distributed import free_port

    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(WORKER), tiny_model_dir, str(stage1["root"] / "adapter"),
           str(tmp_path / "out"), mode]
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert r["sharded"] and r["same_keys"] and r["base_unchanged"] and r["merged_names"]
    assert r["reloaded_equal"] and r["checkpoint_keys_adapters_only"]
    assert r["trainable_after_views"] == r["trainable_expected"] > 0
    assert r["adapter_dtypes"] == ["torch.float32"]
    assert r["adapter_moved"] > 1e-3
    if mode == "fp32":   # two ranks sum the same gradients as one: equal to float rounding
        assert r["base_dtypes"] == ["torch.float32"]
        assert r["adapter_max_diff"] < 1e-5 and r["merged_max_diff"] < 1e-5
        assert r["teacher_view_max_diff"] < 1e-5 and r["base_view_max_diff"] < 1e-5
    else:   # the GPU set-up: a bf16 base and fp32 adapters in one FSDP2 group, bf16 compute
        assert r["base_dtypes"] == ["torch.bfloat16"]
        assert r["teacher_view_max_diff"] < 0.05 and r["base_view_max_diff"] < 0.05


def test_the_gpu_guides_lora_commands_parse_and_its_plan_fits(capsys):
    """docs/gpu_training.md's LoRA block: the plan it shows runs and FITS; the train and export
    commands parse with the flags they use (``...`` stands for the paper's other settings)."""
    import shlex

    from mopd.cli import build_parser, main
    from tests.helpers.readme import GPU_GUIDE

    section = GPU_GUIDE.read_text().split("## LoRA: the paper's Stage II on one GPU", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = [shlex.split(line, comments=True) for line in block.splitlines() if line.strip() and
                not line.lstrip().startswith("#")]
    seen = set()
    for argv in commands:
        argv = [a for a in argv if a != "..."]
        if argv[:5] == ["torchrun", "--nproc_per_node", "1", "-m", "mopd"]:
            argv = ["mopd", *argv[5:]]
        assert argv[0] == "mopd", argv
        seen.add(argv[1])
        if argv[1] == "plan":
            assert main(argv[1:]) == 0 and capsys.readouterr().out.rstrip().endswith("FITS")
        else:
            args = build_parser().parse_args(argv[1:])
            assert getattr(args, "export_adapter", False) or getattr(args, "adapter", False) or \
                "teacher.path=runs/stage1/adapter" in argv or argv[-1] == "runs/stage2/export"
    assert seen == {"plan", "train", "export"}
