"""Worker for test_lora.py's two-rank test: `torchrun --nproc_per_node 2 lora_dist_worker.py MODEL ADAPTER OUT`.

Every rank builds the same four packed micro-batches, attaches the student's LoRA adapter and a
frozen teacher adapter to the tiny model, shards it with ``shard_model`` (FSDP2 over gloo) and
trains on its half of the micro-batches (gradients summed over ranks, the loss normalised by the
global token count); every rank also trains a one-process reference on all four. Then: the
adapter gathered from the shards, the merged weights streamed to an engine, the teacher view's and
the base view's log-probs, and a checkpoint written and read back under FSDP. Rank 0 writes the
findings. ``mixed``: the base loaded in bf16 under FSDP2's bf16 mixed precision (the GPU set-up:
bf16 base, fp32 adapters in one sharded group)."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository root: tests.helpers

from mopd.algo.advantages import role_specs  # noqa: E402
from mopd.config import resolve  # noqa: E402
from mopd.config.inputs import LoraConfig  # noqa: E402
from mopd.train import checkpoint as ckpt  # noqa: E402
from mopd.train import lora  # noqa: E402
from mopd.train.model import PackedCausalLM, load_causal_lm, shard_model  # noqa: E402
from mopd.train.weight_sync import merged_parameters  # noqa: E402
from tests.train.numerics_worker import loss_inputs, make_batches, step_loss  # noqa: E402

STEPS, LR = 3, 1e-2
LORA = LoraConfig(rank=4, alpha=8)


def build(model_dir, adapter_dir, dtype):
    model, _ = load_causal_lm(model_dir, dtype=dtype, device=torch.device("cpu"))
    torch.manual_seed(0)   # the same adapter initialisation in every model
    lora.add_adapters(model, LORA, model_dir)
    lora.load_frozen_adapter(model, adapter_dir, "teacher")
    return model, PackedCausalLM(model)


def optimizer(model):
    """AdamW over the adapters (after sharding: FSDP2 replaces the parameters)."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)


def train(policy, opt, model, batches, inputs, specs, share):
    for _ in range(STEPS):
        normalizer = float(sum(b.loss_tokens for b in batches))
        for i in share:
            old, teacher = inputs[i]
            loss = step_loss(policy, batches[i], old, teacher, specs, normalizer)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def main():
    model_dir, adapter_dir, out = sys.argv[1:4]
    mixed = len(sys.argv) > 4 and sys.argv[4] == "mixed"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1)
    specs = role_specs(resolve("mopd", []).algo)
    ref_model, ref = build(model_dir, adapter_dir, torch.float32)
    ref_opt = optimizer(ref_model)
    batches = make_batches(ref_model.config.vocab_size)
    inputs = [loss_inputs(ref, b, seed=i) for i, b in enumerate(batches)]
    base_before = {k: v.clone() for k, v in ref_model.state_dict().items() if ".lora_" not in k}

    model, policy = build(model_dir, adapter_dir, torch.bfloat16 if mixed else torch.float32)
    shard_model(model, torch.device("cpu"), mixed_precision=mixed, activation_checkpointing=True, root=policy)
    opt = optimizer(model)
    findings = {"sharded": all(hasattr(p, "full_tensor") for p in model.parameters()),
                "adapter_dtypes": sorted({str(p.dtype) for n, p in model.named_parameters() if ".lora_" in n}),
                "base_dtypes": sorted({str(p.dtype) for n, p in model.named_parameters() if ".lora_" not in n})}
    train(policy, opt, model, batches, inputs, specs, share=range(rank, len(batches), 2))
    train(ref, ref_opt, ref_model, batches, inputs, specs, share=range(len(batches)))

    mine, theirs = lora.adapter_state_dict(model), lora.adapter_state_dict(ref_model)
    findings["adapter_max_diff"] = max(float((mine[k] - theirs[k]).abs().max()) for k in theirs)
    findings["adapter_moved"] = max(float(v.abs().max()) for k, v in theirs.items() if "lora_B" in k)
    findings["same_keys"] = sorted(mine) == sorted(theirs)
    findings["base_unchanged"] = all(torch.equal(base_before[k], v) for k, v in ref_model.state_dict().items()
                                     if ".lora_" not in k)
    merged = dict(merged_parameters(model, torch.float32))
    merged_ref = dict(merged_parameters(ref_model, torch.float32))
    findings["merged_names"] = sorted(merged) == sorted(merged_ref) and not any("lora" in k for k in merged)
    findings["merged_max_diff"] = max(float((merged[k] - merged_ref[k]).abs().max()) for k in merged_ref)
    with torch.no_grad():
        for name, view in (("teacher", "teacher"), ("base", None)):
            with lora.active_adapter(model, view):
                got = policy(batches[0])
            with lora.active_adapter(ref_model, view):
                want = ref(batches[0])
            findings[f"{name}_view_max_diff"] = float((got - want).abs().max())
    findings["trainable_after_views"] = sum(p.requires_grad for p in model.parameters())
    findings["trainable_expected"] = sum(p.requires_grad for p in ref_model.parameters())

    path = ckpt.save_checkpoint(out, STEPS, model, opt, {"test": 1})
    model2, policy2 = build(model_dir, adapter_dir, torch.bfloat16 if mixed else torch.float32)
    shard_model(model2, torch.device("cpu"), mixed_precision=mixed, activation_checkpointing=True, root=policy2)
    opt2 = optimizer(model2)
    ckpt.load_checkpoint(path, model2, opt2)
    again = lora.adapter_state_dict(model2)
    findings["reloaded_equal"] = all(torch.equal(again[k], mine[k]) for k in mine)
    findings["checkpoint_keys_adapters_only"] = ckpt.checkpoint_mismatch(path, model2) is None
    if rank == 0:
        Path(out, "findings.json").write_text(json.dumps(findings))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
