"""Worker for test_numerics.py: `torchrun --nproc_per_node 2 numerics_worker.py MODEL OUT_JSON`.

Every rank builds the same four packed micro-batches and trains on its share of them through
``shard_model`` (FSDP2 over gloo); every rank also trains single-process fp32 references on all
four, so the comparison needs no communication beyond FSDP's own. Rank 0 writes the findings.
"""

import json
import sys

import torch
import torch.distributed as dist

from mopd.algo.advantages import role_specs
from mopd.config import resolve
from mopd.train import model as model_lib
from mopd.train.model import PackedCausalLM, load_causal_lm, shard_model
from mopd.train.packing import build_packed_batch

STEPS, LR = 20, 1e-6


def make_batches(vocab, n_batches=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        lengths = torch.randint(5, 40, (3,), generator=g).tolist()
        toks = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
        roles = [torch.randint(-1, 3, (n,), generator=g).tolist() for n in lengths]
        advs = [(torch.randn(n, generator=g) * 0.7).tolist() for n in lengths]
        lps = [[0.0] * n for n in lengths]
        batches.append(build_packed_batch(toks, roles, advs, lps))
    return batches


def loss_inputs(ref_policy, batch, seed):
    """pi_old near the model's own log-probs and teacher log-probs with digits bf16 cannot hold."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        old = ref_policy(batch).float()
    old = old + 1e-3 * torch.randn(old.shape, generator=g)
    teacher = -12.3456789 + torch.randn(old.shape, generator=g) * 1e-3
    return old.contiguous(), teacher.contiguous()


def step_loss(policy, batch, old, teacher, specs, normalizer):
    from mopd_kernels import FusedLinearPolicyLoss, PolicyLossSettings

    batch.old_logp, batch.teacher_logp = old, teacher
    loss, _ = policy(batch, FusedLinearPolicyLoss(PolicyLossSettings(role_specs=specs)), normalizer=normalizer)
    return loss


def full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().clone()


def train(policy, params, batches, inputs, specs, n_tokens, steps):
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), weight_decay=0.0)
    for _ in range(steps):
        for b, (old, teacher) in zip(batches, inputs, strict=True):
            step_loss(policy, b, old, teacher, specs, n_tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return opt


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    specs = role_specs(resolve("mopd").algo)

    ref_lm, _ = load_causal_lm(model_dir, dtype=torch.float32, device=cpu, attn="sdpa")
    ref = PackedCausalLM(ref_lm)
    batches = make_batches(ref_lm.config.vocab_size)
    inputs = [loss_inputs(ref, b, i) for i, b in enumerate(batches)]
    n_tokens = float(sum(b.loss_tokens for b in batches))          # the global count, as the trainer's
    mine = list(range(rank, len(batches), world))
    init = {n: p.detach().clone() for n, p in ref_lm.named_parameters()}
    res = {"world": world}

    # 1. gradients: 2-rank fp32 FSDP2 equals one process over all micro-batches
    lm, _ = load_causal_lm(model_dir, dtype=torch.float32, device=cpu, attn="sdpa")
    pol = PackedCausalLM(lm)
    shard_model(lm, cpu, mixed_precision=False, activation_checkpointing=False, root=pol)
    for i in mine:
        step_loss(pol, batches[i], *inputs[i], specs, n_tokens).backward()
    for i in range(len(batches)):
        step_loss(ref, batches[i], *inputs[i], specs, n_tokens).backward()
    ref_grads = {n: p.grad.clone() for n, p in ref_lm.named_parameters()}
    ref_lm.zero_grad(set_to_none=True)
    diffs = [float((full(p.grad) - ref_grads[n]).abs().max()) for n, p in lm.named_parameters()]
    scale = max(float(g.abs().max()) for g in ref_grads.values())
    res["grad_max_abs_diff"], res["grad_scale"] = max(diffs), scale
    del lm, pol

    # 2. mixed precision: fp32 masters and AdamW state, bf16 compute, loss inputs untouched
    from mopd_kernels import ops  # FusedLinearPolicyLoss.forward calls ops.fused_linear_policy_loss

    seen = []
    real_loss = ops.fused_linear_policy_loss

    def recording_loss(hidden, weight, targets, inputs, settings, normalizer=None, bias=None):
        seen.append({"hidden": hidden.dtype, "weight": weight.dtype, "old": inputs.old_logp,
                     "adv": inputs.advantages, "teacher": inputs.teacher_logp})
        return real_loss(hidden, weight, targets, inputs, settings, normalizer, bias)

    ops.fused_linear_policy_loss = recording_loss
    lm, _ = load_causal_lm(model_dir, dtype=model_lib.master_dtype("auto", cpu, sharded=True), device=cpu,
                           attn="sdpa")
    pol = PackedCausalLM(lm)
    shard_model(lm, cpu, mixed_precision=True, activation_checkpointing=False, root=pol)
    res["param_dtypes"] = sorted({str(p.dtype) for p in lm.parameters()})
    res["params_are_dtensors"] = all(hasattr(p, "full_tensor") for p in lm.parameters())
    opt = train(pol, lm.parameters(), [batches[i] for i in mine], [inputs[i] for i in mine], specs, n_tokens, STEPS)
    ops.fused_linear_policy_loss = real_loss
    res["adam_state_dtypes"] = sorted({str(v.dtype) for st in opt.state.values() for k, v in st.items()
                                       if k in ("exp_avg", "exp_avg_sq")})
    res["compute_dtypes"] = sorted({str(s["hidden"]) for s in seen} | {str(s["weight"]) for s in seen})
    exact = True
    for k, s in enumerate(seen):
        i = mine[k % len(mine)]
        exact &= s["old"].dtype == s["adv"].dtype == s["teacher"].dtype == torch.float32
        exact &= torch.equal(s["old"], inputs[i][0]) and torch.equal(s["teacher"], inputs[i][1])
        exact &= torch.equal(s["adv"], batches[i].advantages)
    res["loss_inputs_fp32_exact"] = bool(exact) and len(seen) == STEPS * len(mine)
    mp_delta = {n: full(p) - init[n] for n, p in lm.named_parameters()}

    # 3. references: fp32 single process, and the old behaviour (bf16 parameters and AdamW)
    def reference(dtype):
        m, _ = load_causal_lm(model_dir, dtype=dtype, device=cpu, attn="sdpa")
        train(PackedCausalLM(m), m.parameters(), batches, inputs, specs, n_tokens, STEPS)
        return {n: p.detach().float() - init[n] for n, p in m.named_parameters()}

    fp32_delta, bf16_delta = reference(torch.float32), reference(torch.bfloat16)

    def rel_err(delta):
        num = sum(float((delta[n] - fp32_delta[n]).norm() ** 2) for n in fp32_delta) ** 0.5
        return num / sum(float(d.norm() ** 2) for d in fp32_delta.values()) ** 0.5

    res["mp_update_rel_err"], res["bf16_update_rel_err"] = rel_err(mp_delta), rel_err(bf16_delta)
    res["fp32_update_norm"] = sum(float(d.norm() ** 2) for d in fp32_delta.values()) ** 0.5
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
