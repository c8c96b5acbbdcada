"""`mopd plan`: parameter counts against transformers, the phase budgets, refusals with reasons."""

import json

import pytest
import torch

from mopd.config import resolve
from mopd.train.memory_plan import GIB, H200_GIB, ModelShape, PlanError, load_model_config, plan_memory

QWEN = "Qwen/Qwen3-4B-Instruct-2507"


@pytest.mark.parametrize("dims", [(97, 24, 3, 40, 4, 2, 6, True), (131, 32, 2, 56, 4, 4, 8, False)])
def test_parameter_count_matches_transformers_qwen3(dims):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    vocab, hidden, layers, inter, heads, kv, head_dim, tied = dims
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                      tie_word_embeddings=tied)
    model = Qwen3ForCausalLM(cfg)
    shape = ModelShape.from_config(cfg.to_dict())
    assert shape.params == sum(p.numel() for p in model.parameters())     # tied weights counted once
    assert shape.kv_bytes_per_token == 2 * layers * kv * head_dim * 2


def test_the_bundled_qwen3_4b_config_is_a_4b_model():
    shape = ModelShape.from_config(load_model_config(QWEN))
    assert shape.params == 4_022_468_096 and shape.tied
    assert shape.kv_bytes_per_token == 144 * 1024


def test_stage2_defaults_fit_8_h200_with_a_replicated_teacher():
    cfg = resolve("mopd", [f"model.path={QWEN}"])
    plan = plan_memory(cfg, gpu_gib=H200_GIB, world=8)
    assert plan.fits, plan.problems
    assert plan.teacher_placement.startswith("replicated")
    assert plan.max_model_len == cfg.rollout.max_input_tokens + cfg.rollout.max_output_tokens
    assert plan.kv_tokens > 10 * plan.max_model_len
    items = {i.name: i.gib for i in plan.training}
    assert items["fp32 master weights (shard)"] == pytest.approx(4 * 4_022_468_096 / 8 / GIB)
    assert items["AdamW moments, fp32 (shard)"] == pytest.approx(2 * items["fp32 master weights (shard)"])
    assert "FITS" in plan.render()


def test_sharding_scales_with_the_world_and_checkpointing_shrinks_activations():
    cfg = resolve("mopd", [f"model.path={QWEN}"])
    p8, p16 = plan_memory(cfg, world=8), plan_memory(cfg, world=16)
    assert p16.training[0].gib == pytest.approx(p8.training[0].gib / 2)
    off = plan_memory(resolve("mopd", [f"model.path={QWEN}", "model.activation_checkpointing=false"]), world=8)
    act = {i.name.split(" (")[0]: i.gib for i in off.training}["activations"]
    act_ckpt = {i.name.split(" (")[0]: i.gib for i in p8.training}["activations"]
    assert act > 5 * act_ckpt


def test_refusals_name_the_reason():
    big = resolve("mopd", [f"model.path={QWEN}", "trainer.micro_batch_tokens=65536",
                           "model.activation_checkpointing=false"])
    plan = plan_memory(big, world=8)
    assert not plan.fits and "activations" in plan.problems[0] and "micro_batch_tokens" in plan.problems[0]
    greedy = plan_memory(resolve("mopd", [f"model.path={QWEN}", "rollout.gpu_memory_utilization=0.97"]), world=8)
    assert any("vLLM would refuse to start" in p for p in greedy.problems)
    assert greedy.teacher_placement == "FSDP2-sharded"        # the replica was tried first and did not fit
    long = plan_memory(resolve("mopd", [f"model.path={QWEN}", "rollout.max_input_tokens=2000000"]), world=8)
    assert any("KV cache" in p for p in long.problems)


def test_the_teacher_is_sharded_when_a_replica_does_not_fit():
    cfg = resolve("mopd", [f"model.path={QWEN}", "rollout.gpu_memory_utilization=0.7"])
    plan = plan_memory(cfg, gpu_gib=40, world=8)
    assert plan.teacher_placement == "FSDP2-sharded" and plan.fits, plan.problems


def test_config_lookup_local_bundled_cache_and_missing(tmp_path, monkeypatch):
    local = tmp_path / "m"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({"vocab_size": 5}))
    assert load_model_config(str(local)) == {"vocab_size": 5}
    assert load_model_config(QWEN)["hidden_size"] == 2560
    snap = tmp_path / "hub" / "models--Org--Small" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"vocab_size": 7}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert load_model_config("Org/Small") == {"vocab_size": 7}
    with pytest.raises(PlanError, match="no config.json for 'Org/Missing'"):
        load_model_config("Org/Missing")
    with pytest.raises(PlanError, match="lacks"):
        ModelShape.from_config({"vocab_size": 5})


def test_cli_prints_the_plan_and_exits_2_when_it_cannot_fit(capsys):
    from mopd.cli import main

    assert main(["plan", "--gpus", "8", "--gpu-gib", "139", "mopd", f"model.path={QWEN}"]) == 0
    assert "FITS" in capsys.readouterr().out
    assert main(["plan", "--gpus", "8", "--gpu-gib", "24", "mopd", f"model.path={QWEN}"]) == 2
    assert "does not fit" in capsys.readouterr().err


def test_frozen_models_are_replicated_when_they_fit_and_sharded_otherwise():
    from mopd.train.memory_plan import shard_frozen_models

    cfg = resolve("mopd", [f"model.path={QWEN}"])
    assert not shard_frozen_models(cfg, world=8, gpu_gib=139)
    assert shard_frozen_models(resolve("mopd", [f"model.path={QWEN}", "rollout.gpu_memory_utilization=0.7"]),
                               world=8, gpu_gib=40)
    assert not shard_frozen_models(cfg, world=1, gpu_gib=40)
    assert shard_frozen_models(resolve("mopd", ["model.path=/nowhere/model"]), world=8, gpu_gib=139)


def test_a_retriever_served_on_the_same_gpus_is_planned_in_both_phases():
    """The GPU guide (docs/gpu_training.md) serves faiss-gpu beside the trainer: its memory is resident in
    both phases, so with it the teacher no longer fits replicated beside vLLM's share, and a large one does
    not fit at all."""
    cfg = resolve("mopd", [f"model.path={QWEN}"])
    bare = plan_memory(cfg, gpu_gib=H200_GIB, world=8)
    served = plan_memory(cfg, gpu_gib=H200_GIB, world=8, retriever_gib=6.0)
    for phase in (served.training, served.rollout):
        assert {i.name: i.gib for i in phase}["GPU retriever (index + faiss scratch)"] == 6.0
    assert bare.teacher_placement.startswith("replicated") and served.teacher_placement == "FSDP2-sharded"
    assert served.fits and served.rollout_gib <= H200_GIB
    too_big = plan_memory(resolve("mopd", [f"model.path={QWEN}", "rollout.gpu_memory_utilization=0.85"]),
                          gpu_gib=H200_GIB, world=8, retriever_gib=20.0)
    assert not too_big.fits and "vLLM would refuse to start" in " ".join(too_big.problems)
    # left to the plan, vLLM's share makes room: (139 - 10.66 trainer - 20 retriever - 2 headroom) / 139 -> 0.76
    roomy = plan_memory(cfg, gpu_gib=H200_GIB, world=8, retriever_gib=20.0)
    assert roomy.fits and roomy.gpu_memory_utilization == 0.76 and roomy.auto_share
    with pytest.raises(PlanError):
        plan_memory(cfg, gpu_gib=H200_GIB, world=8, retriever_gib=-1.0)


def _resident_gib(plan):
    return sum(i.gib for i in plan.rollout if not i.name.startswith("vLLM share"))


@pytest.mark.parametrize("gpu_gib,retriever_gib,share", [(80, 6, 0.76), (141, 6, 0.85), (139, 0, 0.85),
                                                          (40, 6, 0.53), (40, 0, 0.68)])
def test_left_empty_vllms_share_is_what_the_rollout_phase_leaves(gpu_gib, retriever_gib, share):
    """At the old fixed 0.85, 8 H100s beside a 6 GiB retriever needed 84.7 of 80 GiB. The plan
    now gives vLLM what the trainer's resident state leaves, less 2 GiB, at most 0.85: on an H100
    (80 - 1.87 master - 3.75 AdamW - 2.04 teacher shard - 3 context - 6 retriever - 2) / 80 = 0.767."""
    cfg = resolve("mopd", [f"model.path={QWEN}"])
    assert cfg.rollout.gpu_memory_utilization is None
    plan = plan_memory(cfg, gpu_gib=gpu_gib, world=8, retriever_gib=retriever_gib)
    assert plan.fits, plan.problems
    assert plan.auto_share and plan.gpu_memory_utilization == share
    assert share == min(0.85, int(100 * (gpu_gib - _resident_gib(plan) - 2.0) / gpu_gib) / 100)
    assert plan.rollout_gib <= gpu_gib - (2.0 if share < 0.85 else 0) + 1e-9
    assert plan.kv_tokens >= 8 * plan.max_model_len            # an A100 40 beside a retriever: 8 calls at once
    assert f"rollout.gpu_memory_utilization {share:.2f}, chosen by the memory plan" in plan.render()
    fixed = plan_memory(resolve("mopd", [f"model.path={QWEN}", "rollout.gpu_memory_utilization=0.85"]),
                        gpu_gib=80, world=8, retriever_gib=6)
    assert not fixed.fits and fixed.rollout_gib > 84                 # what the issue measured


def test_left_empty_a_replica_is_kept_only_where_vllm_keeps_its_largest_share():
    cfg = resolve("mopd", [f"model.path={QWEN}"])
    h200 = plan_memory(cfg, gpu_gib=H200_GIB, world=8)
    assert h200.teacher_placement.startswith("replicated") and h200.gpu_memory_utilization == 0.85
    h100 = plan_memory(cfg, gpu_gib=80, world=8)   # a replica would cost vLLM 6 GiB of KV cache: sharded
    assert h100.teacher_placement == "FSDP2-sharded" and h100.gpu_memory_utilization == 0.84


def test_cli_plan_for_8_h100_beside_a_retriever_fits_at_the_defaults(capsys):
    from mopd.cli import main

    assert main(["plan", "--gpus", "8", "--gpu-gib", "80", "--retriever-gib", "6", "mopd", f"model.path={QWEN}"]) == 0
    out = capsys.readouterr().out
    assert "FITS" in out and "rollout.gpu_memory_utilization 0.76, chosen by the memory plan for 80 GiB" in out


def test_the_trainer_takes_its_share_from_the_plan_of_its_gpu(monkeypatch, capsys):

    from mopd.config import ConfigError
    from mopd.train.memory_plan import rollout_config_for_gpu

    calls = []
    # an 80 GiB GPU: this process's allocator holds 10 GiB, a retriever 6 more, 64 free
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (64 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 10 * GIB)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    cfg = resolve("mopd", [f"model.path={QWEN}", "rollout.engine=vllm"])
    rollout, line = rollout_config_for_gpu(cfg, world=8)
    assert rollout.gpu_memory_utilization == 0.76 and cfg.rollout.gpu_memory_utilization is None
    assert "0.76" in line and "6.0 held by other processes" in line
    for kept in (resolve("mopd", [f"model.path={QWEN}", "rollout.engine=vllm", "rollout.gpu_memory_utilization=0.5"]),
                 resolve("mopd", [f"model.path={QWEN}"])):                                  # set, or the HF engine
        assert rollout_config_for_gpu(kept, world=8) == (kept.rollout, "")
    from mopd.train.engine_setup import engine_rollout_config

    where = dict(device=torch.device("cuda", 0), world=8, rank=0)
    chosen, note = engine_rollout_config(cfg, **where)
    assert chosen.gpu_memory_utilization == 0.76
    assert calls == ["empty_cache"] and note == line and "0.76" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (14 * GIB, 24 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 10 * GIB)
    with pytest.raises(ConfigError, match="rollout.gpu_memory_utilization: no room for vLLM on this GPU.*KV cache"):
        engine_rollout_config(cfg, **where)


def test_lora_stage2_on_qwen3_4b_fits_one_80gb_gpu_where_full_fine_tuning_does_not(capsys, tmp_path):
    """The issue's command: one base held once in bf16, adapters and their moments in fp32, the
    teacher (the Stage-I adapter) and the reference as views of the base."""
    from mopd.cli import main

    args = ["plan", "--gpus", "1", "--gpu-gib", "80", "--retriever-gib", "6", "mopd",
            "model.path=Qwen/Qwen3-4B-Instruct-2507"]
    assert main(args) == 2
    assert "AdamW moments, fp32 (shard)" in capsys.readouterr().out
    assert main(args + ["model.lora.rank=16"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("FITS")
    names = [line.strip().split("  ")[0] for line in out.splitlines() if line.startswith("    ")]
    assert names.count("frozen base, bf16 (shard)") == 2   # once per phase, never a second copy
    assert "LoRA adapters, fp32 (shard)" in names and "adapters' AdamW moments, fp32 (shard)" in names
    assert not any("teacher/reference" in n or "master" in n for n in names)
    assert "teacher a view of the policy's base" in out


def test_lora_parameters_and_state_are_counted_from_the_shape():
    shape = ModelShape.from_config(load_model_config("Qwen/Qwen3-4B-Instruct-2507"))
    per_layer = 16 * ((2560 + 4096) * 2 + (2560 + 1024) * 2 + (2560 + 9728) * 3)
    assert shape.lora_params(16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")) \
        == 36 * per_layer == shape.lora_params(16, ("all-linear",))
    assert shape.lora_params(8, ("q_proj", "v_proj")) == 36 * 8 * ((2560 + 4096) + (2560 + 1024))
    cfg = resolve("mopd", ["model.path=Qwen/Qwen3-4B-Instruct-2507", "model.lora.rank=16"])
    plan = plan_memory(cfg, gpu_gib=80, world=4)
    items = {i.name: i.gib for i in plan.training}
    assert items["frozen base, bf16 (shard)"] == pytest.approx(2 * shape.params / 4 / GIB)
    assert items["adapters' AdamW moments, fp32 (shard)"] == pytest.approx(8 * 36 * per_layer / 4 / GIB)
    assert items["fp32 gradient shard"] == pytest.approx(4 * 36 * per_layer / 4 / GIB)
    # a teacher given as a full model of another directory is a copy, as without LoRA
    full_teacher = resolve("mopd", ["model.path=Qwen/Qwen3-4B-Instruct-2507", "model.lora.rank=16",
                                    "teacher.path=Qwen/Qwen3-4B-Instruct-2507-other"])
    plan = plan_memory(full_teacher, gpu_gib=80, world=1, frozen_configs=[load_model_config("Qwen/Qwen3-4B-Instruct-2507")])
    assert any(i.name.startswith("teacher/reference") for i in plan.training)
    # a LoRA pipeline plans Stage II before Stage I has written the adapter its teacher will be
    for unwritten in ("runs/paper/stage1/export_adapter", "/nowhere/stage1/export_adapter"):
        planned = resolve("mopd", ["model.path=Qwen/Qwen3-4B-Instruct-2507", "model.lora.rank=16",
                                   f"teacher.path={unwritten}"])
        assert plan_memory(planned, gpu_gib=80, world=1).teacher_placement.startswith("a view of the policy's base")

