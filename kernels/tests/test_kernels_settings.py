"""PolicyLossSettings (checked once, frozen), LossInputs (cut together), the FusedLinearPolicyLoss
module (the functional entry behind a module), and the parameter budget of the package's functions."""

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

import mopd_kernels
from mopd_kernels import (
    FusedLinearPolicyLoss,
    LossInputs,
    PolicyLossSettings,
    RoleSpec,
    fused_linear_policy_loss,
    stats_to_floats,
)
from kernel_cases import make_batch

SPECS = [RoleSpec("outcome", entropy_coef=0.01, name="leader"), RoleSpec("opd", kl_coef=0.1)]


@pytest.mark.parametrize("change, name", [
    (dict(role_specs=[]), "role_specs"),
    (dict(role_specs=[RoleSpec(), "opd"]), "role_specs"),
    (dict(role_specs=RoleSpec()), "role_specs"),
    (dict(clip_low=1.0), "clip_low"),
    (dict(clip_low=-0.1), "clip_low"),
    (dict(clip_low=None), "clip_low"),
    (dict(clip_high=-0.5), "clip_high"),
    (dict(clip_high=float("inf")), "clip_high"),
    (dict(dual_clip=1.0), "dual_clip"),
    (dict(dual_clip="3"), "dual_clip"),
    (dict(temperature=0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(backend="cuda"), "backend"),
    (dict(chunk_rows=0), "chunk_rows"),
    (dict(chunk_rows=2.5), "chunk_rows"),
    (dict(chunk_rows=True), "chunk_rows"),
])
def test_settings_are_checked_when_made(change, name):
    kw = dict(role_specs=SPECS)
    kw.update(change)
    with pytest.raises(ValueError, match=name):
        PolicyLossSettings(**kw)


def test_settings_are_frozen_hashable_and_keep_a_tuple():
    s = PolicyLossSettings(SPECS, clip_high=0.28, dual_clip=3.0, temperature=0.6, chunk_rows=64)
    assert s.role_specs == tuple(SPECS) and isinstance(s.role_specs, tuple)
    same = PolicyLossSettings(tuple(SPECS), clip_high=0.28, dual_clip=3.0, temperature=0.6, chunk_rows=64)
    assert s == same
    assert hash(s) == hash(PolicyLossSettings(list(SPECS), clip_high=0.28, dual_clip=3.0, temperature=0.6,
                                              chunk_rows=64))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.clip_low = 0.1
    assert s.n_roles == 2 and s.role_names == ["leader", "role1"]
    assert s.has_entropy_term and not PolicyLossSettings([RoleSpec()]).has_entropy_term
    table = s.role_table(torch.device("cpu"))
    assert table.shape == (2, 8) and table is s.role_table(torch.device("cpu"))  # cached


def test_loss_inputs_cut_every_tensor_together():
    g = torch.Generator().manual_seed(0)
    T = 11
    roles = torch.randint(-1, 2, (T,), generator=g)
    old, adv, teacher = (torch.randn(T, generator=g, dtype=torch.float64) for _ in range(3))
    inputs = LossInputs(roles, old, adv, teacher_logp=teacher)
    index = torch.tensor([7, 2, 9])
    picked = inputs.select(index)
    assert torch.equal(picked.roles, roles[index]) and torch.equal(picked.old_logp, old[index])
    assert torch.equal(picked.advantages, adv[index]) and torch.equal(picked.teacher_logp, teacher[index])
    assert picked.ref_logp is None and inputs.select(None) is inputs
    part = inputs.rows(3, 8)
    assert torch.equal(part.teacher_logp, teacher[3:8]) and torch.equal(part.roles, roles[3:8])
    k = inputs.for_kernels()
    assert k.old_logp.dtype == torch.float32 and k.roles.dtype == roles.dtype and k.ref_logp is None
    assert torch.equal(k.advantages, adv.float())
    w = torch.randn(T, requires_grad=True)
    assert not LossInputs(roles, w, w).for_kernels().old_logp.requires_grad


@pytest.mark.parametrize("backend", ["torch", "triton", "reference"])
def test_module_equals_the_functional_entry(backend):
    batch = make_batch(23, 8, 150, SPECS, drift=1.0)
    settings = PolicyLossSettings(SPECS, clip_high=0.28, dual_clip=2.0, temperature=0.8, backend=backend,
                                  chunk_rows=7)
    norm = torch.tensor(40.0)
    results = []
    for call in ("functional", "module"):
        h = batch.hidden.clone().requires_grad_(True)
        w = batch.weight.clone().requires_grad_(True)
        if call == "functional":
            loss, stats = fused_linear_policy_loss(h, w, batch.targets, batch.inputs(), settings, norm)
        else:
            loss_fn = FusedLinearPolicyLoss(settings)
            loss, stats = loss_fn(h, w, batch.targets, batch.inputs(), normalizer=norm)
        loss.backward()
        results.append((loss.detach(), h.grad, w.grad, stats_to_floats(stats, settings.role_names)))
    (l1, gh1, gw1, s1), (l2, gh2, gw2, s2) = results
    assert torch.equal(l1, l2) and torch.equal(gh1, gh2) and torch.equal(gw1, gw2) and s1 == s2
    assert s1["leader/tokens"] == float((batch.roles == 0).sum())


def test_module_holds_settings_only():
    settings = PolicyLossSettings(SPECS, temperature=0.7)
    loss_fn = FusedLinearPolicyLoss(settings)
    assert loss_fn.settings is settings
    assert list(loss_fn.parameters()) == [] and list(loss_fn.buffers()) == [] and loss_fn.state_dict() == {}
    assert "temperature=0.7" in repr(loss_fn)
    with pytest.raises(ValueError, match="PolicyLossSettings"):
        FusedLinearPolicyLoss(SPECS)


def test_old_loose_argument_call_is_refused_with_a_clear_error():
    b = make_batch(5, 4, 9, SPECS)
    with pytest.raises(ValueError, match="settings must be a PolicyLossSettings"):
        fused_linear_policy_loss(b.hidden, b.weight, b.targets, b.inputs(), SPECS)
    with pytest.raises(ValueError, match="inputs must be a LossInputs"):
        fused_linear_policy_loss(b.hidden, b.weight, b.targets, b.old_logp, PolicyLossSettings(SPECS))


# Functions allowed more than 8 parameters: Triton kernels (their signature is the launch ABI), the
# custom ops whose schema torch.library builds from the Python signature (tensors and scalars only), and
# linear_logprobs, the op's public face, whose keyword-only arguments mirror that schema one to one.
SCHEMA_BOUND = {"_linear_logprobs_backward_impl", "_linear_logprobs_backward_fake", "_linear_logprobs_impl",
                "_linear_logprobs_fake", "linear_logprobs"}


def _is_triton_jit(node):
    return any("jit" in ast.unparse(d) for d in node.decorator_list)


def test_no_python_function_takes_more_than_8_parameters():
    root = Path(mopd_kernels.__file__).parent
    over = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _is_triton_jit(node):
                continue
            a = node.args
            n = (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None)
                 + (a.kwarg is not None))
            if n > 8 and node.name not in SCHEMA_BOUND:
                over.append(f"{path.name}:{node.lineno} {node.name} ({n})")
    assert not over, over


def test_readme_usage_example_runs():
    """The README's trainer example, run on tiny tensors (so the documented API cannot rot)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("## Use it in a trainer", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    g = torch.Generator().manual_seed(0)
    T, H, V = 40, 8, 97
    lm_head, teacher_lm_head = torch.nn.Linear(H, V, bias=False), torch.nn.Linear(H, V, bias=False)
    logged = []
    env = dict(hidden=torch.randn(T, H, generator=g, requires_grad=True),
               hidden_old=torch.randn(T, H, generator=g), teacher_hidden=torch.randn(T, H, generator=g),
               lm_head=lm_head, teacher_lm_head=teacher_lm_head,
               targets=torch.randint(0, V, (T,), generator=g),
               roles=torch.randint(-1, 3, (T,), generator=g), advantages=torch.randn(T, generator=g),
               global_loss_tokens=2.0 * T, log=logged.append)
    exec(compile(code, "README.md", "exec"), env)
    assert env["hidden"].grad is not None and lm_head.weight.grad is not None
    assert set(logged[0]) >= {"leader/clip_frac", "searcher/opd_log_ratio", "answerer/tokens"}
    assert env["loss_fn"].settings.temperature == 0.6
