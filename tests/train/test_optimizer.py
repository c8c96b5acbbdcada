"""The trainer's AdamW (mopd.train.optimizer): fused where torch has it, the same updates as the
per-parameter loop within float rounding (full fine-tuning, LoRA adapters over an fp32 or a bf16
base, FSDP2's DTensors), the multi-tensor path where the fused kernel does not apply, and the choice
kept across a checkpoint written by the loop."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from mopd.train.optimizer import FOREACH, FUSED, adamw_implementation, build_adamw, describe

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
WORKER = Path(__file__).parent / "optimizer_worker.py"
HYPER = {"lr": 3e-3, "weight_decay": 0.1}
# fp32: the fused kernel computes the same AdamW update in another order; after a few steps the
# weights (of size ~1) agree to a few ulps of fp32, far below one step's change (~lr)
TOL = {"rtol": 1e-5, "atol": 2e-6}


def odd_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(37, 11), nn.Linear(11, 23), nn.LayerNorm(23), nn.Linear(23, 5, bias=False))


def loop_adamw(params) -> torch.optim.AdamW:
    """torch's per-parameter AdamW (the trainer's optimizer before this module), the same hyperparameters."""
    return torch.optim.AdamW(params, betas=(0.9, 0.999), foreach=False, fused=False, **HYPER)


def run_steps(pairs, optimizers, steps: int, seed: int) -> None:
    """``steps`` updates of both optimizers with the same random gradients (of mixed scales, some
    tensors left without a gradient at a step, as a frozen-by-use parameter is)."""
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for i, (a, b) in enumerate(pairs):
            if (i + step) % 5 == 4:
                a.grad = b.grad = None
                continue
            g = torch.randn(a.shape, generator=gen, dtype=torch.float32) * 10.0 ** (i % 3 - 1)
            a.grad, b.grad = g.to(a.dtype), g.to(b.dtype).clone()
        for opt in optimizers:
            opt.step()


def trainable(model: nn.Module):
    return [p for p in model.parameters() if p.requires_grad]


def max_abs_diff(model_a: nn.Module, model_b: nn.Module) -> float:
    return max((a - b).abs().max().item() for a, b in zip(model_a.parameters(), model_b.parameters()))


def test_fused_on_cpu_equals_the_per_parameter_loop_over_several_steps():
    fused_model = odd_model(0)
    loop_model = copy.deepcopy(fused_model)
    opt = build_adamw(trainable(fused_model), **HYPER)
    assert opt.implementation == FUSED and all(g["fused"] for g in opt.param_groups)
    ref = loop_adamw(trainable(loop_model))
    start = copy.deepcopy(loop_model)
    run_steps(list(zip(fused_model.parameters(), loop_model.parameters())), [opt, ref], steps=7, seed=1)
    for a, b, s in zip(fused_model.parameters(), loop_model.parameters(), start.parameters()):
        assert not torch.equal(b, s)                       # the steps moved every tensor
        torch.testing.assert_close(a, b, **TOL)
    for p, q in zip(trainable(fused_model), trainable(loop_model)):
        torch.testing.assert_close(opt.state[p]["exp_avg"], ref.state[q]["exp_avg"], **TOL)
        torch.testing.assert_close(opt.state[p]["exp_avg_sq"], ref.state[q]["exp_avg_sq"], rtol=1e-5, atol=1e-9)
        assert float(opt.state[p]["step"]) == float(ref.state[q]["step"])
    line = describe(opt)
    n = sum(p.numel() for p in fused_model.parameters())
    assert line == f"optimizer: AdamW (fused), 6 tensors, {n:,} parameters"


def test_complex_parameters_take_the_multi_tensor_path_with_the_same_updates():
    # the fused kernel takes floating-point tensors only: one complex tensor sends the group to foreach
    torch.manual_seed(2)
    real = [nn.Parameter(torch.randn(13, 3)), nn.Parameter(torch.randn(29))]
    cplx = nn.Parameter(torch.randn(6, 5, dtype=torch.complex64))
    params = real + [cplx]
    assert adamw_implementation(real) == FUSED
    assert adamw_implementation(params) == FOREACH
    twins = [nn.Parameter(p.detach().clone()) for p in params]
    opt, ref = build_adamw(params, **HYPER), loop_adamw(twins)
    assert opt.implementation == FOREACH and all(g["foreach"] and not g["fused"] for g in opt.param_groups)
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        for p, q in zip(params, twins):
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            q.grad = p.grad.clone()
        opt.step()
        ref.step()
    for p, q in zip(params, twins):
        torch.testing.assert_close(p, q, **TOL)


@pytest.mark.parametrize("base_dtype", [torch.float32, torch.bfloat16])
def test_lora_adapters_alone_are_updated_as_by_the_loop(tiny_model_dir, base_dtype):
    """A LoRA run: the base frozen (bf16 when model.dtype is bf16), the fp32 adapters alone in the optimizer."""
    from mopd.config.inputs import LoraConfig
    from mopd.train import lora
    from mopd.train.model import load_causal_lm

    models = []
    for _ in range(2):
        model, _ = load_causal_lm(tiny_model_dir, dtype=base_dtype, device=torch.device("cpu"))
        lora.add_adapters(model, LoraConfig(rank=3, alpha=6, target_modules=("q_proj", "v_proj", "down_proj")))
        models.append(model)
    fused_model, loop_model = models
    with torch.no_grad():   # PEFT zeroes lora_B: random values, so that every adapter matrix is exercised
        for a, b in zip(trainable(fused_model), trainable(loop_model)):
            b.copy_(a.normal_(std=0.05))
    params = trainable(fused_model)
    assert params and all(p.dtype == torch.float32 and "lora_" in n
                          for n, p in fused_model.named_parameters() if p.requires_grad)
    frozen_before = {n: p.detach().clone() for n, p in fused_model.named_parameters() if not p.requires_grad}
    assert {p.dtype for p in frozen_before.values()} == {base_dtype}
    opt = build_adamw(params, **HYPER)
    assert opt.implementation == FUSED
    assert sum(len(g["params"]) for g in opt.param_groups) == len(params)
    ref = loop_adamw(trainable(loop_model))
    run_steps(list(zip(params, trainable(loop_model))), [opt, ref], steps=6, seed=4)
    for a, b in zip(params, trainable(loop_model)):
        torch.testing.assert_close(a, b, **TOL)
    for n, p in fused_model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen_before[n]), n


@pytest.mark.parametrize("via_dcp", [False, True])
def test_a_checkpoint_of_the_loop_resumes_into_the_fused_optimizer(via_dcp):
    """A checkpoint written before this change (the loop's state, ``fused=None`` in its groups)
    loads, keeps the fused choice, and continues as the loop would have."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    old_model = odd_model(5)
    old = torch.optim.AdamW(old_model.parameters(), betas=(0.9, 0.999), **HYPER)   # the trainer's old optimizer
    run_steps(list(zip(old_model.parameters(), copy.deepcopy(old_model).parameters())), [old], steps=3, seed=6)
    saved_model = copy.deepcopy(old_model.state_dict())
    if via_dcp:   # what mopd.train.checkpoint saves and loads
        _, saved_optim = get_state_dict(old_model, old)
    else:
        saved_optim = old.state_dict()
    saved_optim = copy.deepcopy(saved_optim)
    assert saved_optim["param_groups"][0]["fused"] is None

    resumed = odd_model(99)
    resumed.load_state_dict(saved_model)
    opt = build_adamw(resumed.parameters(), **HYPER)
    if via_dcp:
        set_state_dict(resumed, opt, model_state_dict=resumed.state_dict(), optim_state_dict=saved_optim)
    else:
        opt.load_state_dict(saved_optim)
    assert all(g["fused"] is True and g["foreach"] is False for g in opt.param_groups)
    for p, q in zip(resumed.parameters(), old_model.parameters()):
        step = opt.state[p]["step"]
        assert step.dtype == torch.float32 and step.device == p.device
        assert float(step) == float(old.state[q]["step"]) in (2.0, 3.0)   # a tensor skips a step without gradient
        assert torch.equal(opt.state[p]["exp_avg_sq"], old.state[q]["exp_avg_sq"])

    run_steps(list(zip(resumed.parameters(), old_model.parameters())), [opt, old], steps=4, seed=7)
    assert all(g["fused"] for g in opt.param_groups)
    for a, b in zip(resumed.parameters(), old_model.parameters()):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.slow
def test_fsdp2_dtensor_parameters_take_the_fused_kernel_with_the_same_updates(tmp_path):
    """Two processes, gloo, FSDP2 on CPU: the parameters are DTensor shards (uneven: odd shapes)."""
    from tests.train.test_distributed import free_port

    out = tmp_path / "result.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(WORKER), str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env,
                       cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["implementation"] == FUSED and r["dtensor"] is True
    assert r["moved"] > 1e-3                   # the updates changed the weights
    assert r["max_abs_diff"] < 2e-6            # and the sharded fused ones equal the unsharded loop's


def test_the_trainer_builds_it_once_and_says_which_in_the_run_log(tiny_model_dir, qa_file, tmp_path):
    from mopd.config import resolve
    from mopd.train.trainer import PolicyTrainer
    from tests.helpers.retrievers import FakeRetriever
    from tests.helpers.training import tiny_overrides

    out = tmp_path / "run"
    t = PolicyTrainer(resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, out)), retriever=FakeRetriever(),
                      progress=False)
    try:
        params = [p for p in t.model.parameters() if p.requires_grad]
        assert t.optimizer.implementation == FUSED
        assert [p for g in t.optimizer.param_groups for p in g["params"]] == params
        events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
        said = [e["message"] for e in events if e["kind"] == "optimizer"]
        assert said == [f"optimizer: AdamW (fused), {len(params)} tensors, {sum(p.numel() for p in params):,} parameters"]
    finally:
        t.close()
