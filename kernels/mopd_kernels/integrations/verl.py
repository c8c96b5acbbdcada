"""verl (0.9) integration: ``linear_logprobs`` in verl's fused-kernel forward, and the fused loss's
policy terms in verl's policy-loss registry.

    from mopd_kernels.integrations import verl as mopd_verl
    mopd_verl.install()          # before the actor builds its model; idempotent; uninstall() undoes it
    # then, in the actor config:  use_fused_kernels=True, policy_loss.loss_mode="mopd"

verl's policy-loss registry is called with log-probs (the model's forward has already turned hidden
states into them), so the whole fused loss cannot enter there. What ``install`` does:

1. **The fused-kernel forward.** With ``actor_rollout_ref.model.use_fused_kernels=True`` verl's
   patched forward computes each token's log-prob and entropy from the last hidden states and the
   lm-head weight through ``verl.utils.experimental.torch_functional.FusedLinearForPPO`` (backends
   ``torch`` and ``liger``) or ``verl.utils.kernel.linear_cross_entropy.linear_cross_entropy``
   (``triton``; CUDA only, it needs NVTX). Both names are looked up at each call, and ``install``
   points them at ``mopd_kernels.linear_logprobs``: the Triton row kernels on CUDA, the chunked
   torch pass elsewhere (verl's own triton kernel cannot run on a CPU build), log-probs and
   entropies in fp32, gradients for any upstream gradient of either, an FSDP2-sharded weight
   gathered whole.
2. **The policy loss.** ``loss_mode="mopd"``: the clipped surrogate of ``mopd_kernels.terms`` (the
   formula the fused kernels use) with verl's clip settings (``clip_ratio``, ``clip_ratio_low``,
   ``clip_ratio_high``, ``clip_ratio_c`` as the dual clip, the log-ratio clamped at 20 as verl
   does), rollout importance weights, and verl's own ``agg_loss`` with the global batch counts: the
   same loss and metrics as ``vanilla``.

verl 0.9.1's ``apply_monkey_patch`` imports ``trl.AutoModelForCausalLMWithValueHead`` whenever trl is
installed, which trl >= 1.0 no longer has; in an environment with both, set
``verl.models.transformers.monkey_patch.is_trl_available = lambda: False`` first (verl's issue, not
this package's).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import verl.utils.experimental.torch_functional as verl_torch_functional
import verl.utils.kernel.linear_cross_entropy as verl_linear_cross_entropy
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss, register_policy_loss

from mopd_kernels.inputs import LossInputs
from mopd_kernels.ops import linear_logprobs
from mopd_kernels.roles import RoleSpec
from mopd_kernels.settings import PolicyLossSettings
from mopd_kernels.terms import importance_ratio, policy_term

POLICY_LOSS_NAME = "mopd"
VERL_LOG_RATIO_CLAMP = 20.0
"""verl's ``compute_policy_loss_vanilla`` clamps ``log_prob - old_log_prob`` to +-20."""

_ORIGINALS: dict = {}


def _flat_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float):
    H = hidden.shape[-1]
    logp, entropy = linear_logprobs(hidden.reshape(-1, H), weight, labels.reshape(-1).long(),
                                    temperature=float(temperature))
    return logp, entropy


class FusedLinearForPPO(torch.nn.Module):
    """Drop-in for ``verl.utils.experimental.torch_functional.FusedLinearForPPO`` on ``linear_logprobs``:
    ``forward(hidden_states [..., H], vocab_weights [V, H], input_ids [...], temperature)`` returns
    ``(log_probs, entropy)`` shaped like ``input_ids``, fp32."""

    def __init__(self, chunk_size: int = 512, impl_backend: str = "torch"):
        super().__init__()
        self.chunk_size = chunk_size      # kept for verl's signature; the chunks are sized by mopd_kernels
        self.impl_backend = impl_backend

    def forward(self, hidden_states: torch.Tensor, vocab_weights: torch.Tensor, input_ids: torch.Tensor,
                temperature: float = 1.0):
        if hidden_states.shape[:-1] != input_ids.shape:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} must match hidden_states "
                             f"{tuple(hidden_states.shape[:-1])}")
        logp, entropy = _flat_logprobs(hidden_states, vocab_weights, input_ids, temperature)
        return logp.reshape(input_ids.shape), entropy.reshape(input_ids.shape)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         temperature: float = 1.0, reduction: str = "none", dist_process_group=None):
    """Drop-in for ``verl.utils.kernel.linear_cross_entropy.linear_cross_entropy``: flattened fp32
    ``(log_probs, entropy)`` (``reduction="none"``), or their sums or means."""
    if dist_process_group is not None:
        raise ValueError("mopd_kernels' linear_cross_entropy has no vocabulary-parallel mode "
                         "(dist_process_group must be None)")
    logp, entropy = _flat_logprobs(hidden, weight, labels, temperature)
    if reduction == "none":
        return logp, entropy
    if reduction == "sum":
        return logp.sum(), entropy.sum()
    if reduction == "mean":
        return logp.mean(), entropy.mean()
    raise ValueError(f"reduction={reduction!r}: choose none, sum or mean")


def _clip_settings(config) -> PolicyLossSettings:
    clip = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip
    return PolicyLossSettings([RoleSpec()], clip_low=float(low), clip_high=float(high),
                              dual_clip=float(config.get("clip_ratio_c", 3.0)), log_ratio_clip=VERL_LOG_RATIO_CLAMP)


def fused_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                      response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config: Any = None,
                      rollout_is_weights: Optional[torch.Tensor] = None):
    """verl's policy-loss signature (``[B, R]`` tensors, an ``ActorConfig``): ``(loss, metrics)``."""
    if config is None:
        raise ValueError("the mopd policy loss needs verl's actor config (clip ratios, global batch counts)")
    settings = _clip_settings(config)
    mask = response_mask.bool()
    logp, old, A = log_prob[mask], old_log_prob[mask], advantages[mask]
    inputs = LossInputs(roles=torch.zeros_like(A, dtype=torch.long), old_logp=old, advantages=A)
    terms = policy_term(A, importance_ratio(logp, old, inputs, settings), logp, settings)
    pg_losses = torch.zeros_like(log_prob).masked_scatter(mask, terms["pg"].to(log_prob.dtype))
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode,
                    **config.global_batch_info)
    n = max(int(mask.sum()), 1)
    neg_kl = (logp - old).clamp(-VERL_LOG_RATIO_CLAMP, VERL_LOG_RATIO_CLAMP)
    metrics = {"actor/pg_clipfrac": float(terms["clipped"].sum()) / n,
               "actor/ppo_kl": float(-neg_kl.detach().sum()) / n,
               "actor/pg_clipfrac_lower": float(terms["dual_capped"].sum()) / n}
    return loss, metrics


def install() -> None:
    """Point verl's fused-kernel forward at ``linear_logprobs`` and register ``loss_mode="mopd"``."""
    if not _ORIGINALS:
        _ORIGINALS["FusedLinearForPPO"] = verl_torch_functional.FusedLinearForPPO
        _ORIGINALS["linear_cross_entropy"] = verl_linear_cross_entropy.linear_cross_entropy
    verl_torch_functional.FusedLinearForPPO = FusedLinearForPPO
    verl_linear_cross_entropy.linear_cross_entropy = linear_cross_entropy
    if POLICY_LOSS_REGISTRY.get(POLICY_LOSS_NAME) is not fused_policy_loss:
        POLICY_LOSS_REGISTRY.pop(POLICY_LOSS_NAME, None)
        register_policy_loss(POLICY_LOSS_NAME)(fused_policy_loss)


def uninstall() -> None:
    """Undo ``install``: verl's own kernels back, ``mopd`` out of the registry."""
    if _ORIGINALS:
        verl_torch_functional.FusedLinearForPPO = _ORIGINALS.pop("FusedLinearForPPO")
        verl_linear_cross_entropy.linear_cross_entropy = _ORIGINALS.pop("linear_cross_entropy")
    POLICY_LOSS_REGISTRY.pop(POLICY_LOSS_NAME, None)
