"""``FusedGRPOTrainer``: TRL's ``GRPOTrainer`` with the fused lm-head policy loss.

    from mopd_kernels.integrations.trl import FusedGRPOTrainer
    trainer = FusedGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)

It takes exactly ``GRPOTrainer``'s arguments. TRL (1.16) scores completions with its chunked lm head
(``trl.trainer.utils.add_fused_lm_head``: log-probs and entropies tile by tile, recomputed for the
backward) and then computes the loss from them; here the model's forward returns the last hidden
states of the completion positions and ``FusedLinearGRPOLoss`` computes the loss *and* its
gradients in one pass over the vocabulary (three lm-head matmuls per token instead of four, no
``[B, T, V]`` logits, per-token terms in fp32). The loss is TRL's, term for term, for:

- ``loss_type`` ``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``cispo``, ``sapo`` (with their
  normalisations, gradient accumulation and ``num_items_in_batch`` included);
- ``beta`` (k3 KL to the reference model) with or without ``use_bias_correction_kl``;
- ``importance_sampling_level`` ``token`` or ``sequence`` (GSPO), ``epsilon``/``epsilon_high``,
  ``delta`` (two-sided clipping), ``num_iterations`` (on-policy steps pass no old log-probs and cost
  nothing extra), the static ``entropy_coef`` bonus, ``tool_mask``, vLLM's importance-sampling
  correction, ``cast_lm_head_to_fp32``, ``temperature``, bf16/fp16 autocast.

- an lm head with a bias (its gradient included);
- sequence-level importance sampling with ``cispo`` (the REINFORCE term weighted by the sequence's
  stopped, capped ratio) and ``sapo`` (the soft gate of the sequence's ratio), as TRL computes them.

It refuses at construction, in one line naming the option, what it does not compute:
``loss_type`` ``luspo``/``vespo``, ``top_entropy_quantile < 1`` and ``off_policy_mask_threshold``
(they need every token's entropy or log-prob before any gradient), ``use_adaptive_entropy``, MoE
router aux losses, ``delta <= 1 + epsilon_high``, models with logit soft-capping or logit scaling,
and a PEFT adapter on the lm head. Multimodal inputs are refused at the first batch.

Logged like TRL, with the same values on the same batch: ``entropy``, ``kl``, ``clip_ratio/low_mean``,
``high_mean``, ``region_mean`` (token means over all processes), ``clip_ratio/low_min`` / ``high_max``
(per-sequence extremes over all processes), ``cispo_clip_ratio``, and ``policy_loss`` and
``entropy_coef`` where the entropy bonus is on. Each micro-batch's values stay on the device (0-d
tensors, gathered across processes without a host sync); ``log`` turns them into numbers, one host
transfer per logging step. (TRL counts a completion with no trained token as an unclipped sequence
in ``low_min`` under sequence-level importance sampling; here it is no sequence.)
"""

from __future__ import annotations

import functools
import types

import torch
from trl import GRPOTrainer

from mopd_kernels.aggregation import Aggregation
from mopd_kernels.completions import Completions, FusedLinearGRPOLoss
from mopd_kernels.roles import RoleSpec
from mopd_kernels.settings import PolicyLossSettings

SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo")
MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "image_sizes", "num_images",
                   "spatial_shapes", "num_tiles", "token_type_ids", "mm_token_type_ids", "image_position_ids")


class UnsupportedOption(ValueError):
    """A GRPOConfig option, or a model, that the fused loss does not compute (one line)."""


def unsupported_options(trainer: GRPOTrainer, model) -> list:
    """One line per option of ``trainer``'s config (or property of ``model``) the fused loss lacks."""
    args = trainer.args
    found = []
    if trainer.loss_type not in SUPPORTED_LOSS_TYPES:
        found.append(f"loss_type={trainer.loss_type!r} (supported: {', '.join(SUPPORTED_LOSS_TYPES)})")
    if trainer.top_entropy_quantile < 1.0:
        found.append(f"top_entropy_quantile={trainer.top_entropy_quantile} (needs every token's entropy before "
                     "any gradient; use 1.0)")
    if trainer.off_policy_mask_threshold is not None:
        found.append(f"off_policy_mask_threshold={trainer.off_policy_mask_threshold} (needs every token's "
                     "log-prob before any gradient)")
    if trainer.use_adaptive_entropy:
        found.append("use_adaptive_entropy=True (a static entropy_coef is supported)")
    if trainer.aux_loss_enabled:
        found.append("a MoE router aux loss (router_aux_loss_coef != 0 on a model with output_router_logits)")
    delta = getattr(args, "delta", None)
    if delta is not None and not delta > 1.0 + trainer.epsilon_high:
        found.append(f"delta={delta} (two-sided clipping is supported for delta > 1 + epsilon_high = "
                     f"{1.0 + trainer.epsilon_high})")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    text_config = base.config.get_text_config()
    if getattr(text_config, "final_logit_softcapping", None) is not None:
        found.append("a model with final_logit_softcapping")
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling"):
        value = getattr(text_config, name, None)
        if value is not None and value != 1.0:
            found.append(f"a model with {name}={value}")
    head = base.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        found.append("a model without an lm-head weight (get_output_embeddings)")
    elif type(head).__module__.startswith("peft"):
        found.append("a PEFT adapter on the lm head")
    return found


def add_fused_policy_loss(model) -> None:
    """Patch ``model`` (as TRL's ``add_fused_lm_head`` does) so that ``model(..., fused_policy_loss=f)``
    runs the backbone and returns ``f(hidden_states, lm_head_weight, lm_head_bias)``; any other call is the
    model's own forward. The backbone and head are looked up per call (FSDP and PEFT replace them)."""
    previous = model.forward

    @functools.wraps(type(model).forward)
    def forward(self, *args, fused_policy_loss=None, **kwargs):
        if fused_policy_loss is None:
            return previous(*args, **kwargs)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state
        head = self.get_output_embeddings()
        return fused_policy_loss(hidden.to(head.weight.device), head.weight, getattr(head, "bias", None))

    model.forward = types.MethodType(forward, model)


class FusedGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose policy loss is ``mopd_kernels``' fused lm-head loss (see the module)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        found = unsupported_options(self, self.model)
        if found:
            raise UnsupportedOption(f"FusedGRPOTrainer does not support {found[0]}"
                                    + (f" (and {len(found) - 1} more: {'; '.join(found[1:])})" if len(found) > 1
                                       else ""))
        add_fused_policy_loss(self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model)

    def _loss_settings(self) -> PolicyLossSettings:
        objective = {"cispo": "cispo", "sapo": "sapo"}.get(self.loss_type, "ppo")
        entropy_coef = self.entropy_coef if self._entropy_bonus_enabled else 0.0
        spec = RoleSpec(kl_coef=float(self.beta), kl_type="k3", entropy_coef=float(entropy_coef), name="policy")
        return PolicyLossSettings(
            [spec], clip_low=float(self.epsilon_low), clip_high=float(self.epsilon_high),
            dual_clip=getattr(self.args, "delta", None), temperature=float(self.temperature), objective=objective,
            importance_sampling=self.importance_sampling_level,
            kl_bias_correction=bool(self.beta != 0.0 and self.args.use_bias_correction_kl),
            cispo_max_weight=float(self.epsilon_high) if objective == "cispo" else None,
            sapo_temperatures=(float(self.args.sapo_temperature_pos), float(self.args.sapo_temperature_neg)),
            matmul_dtype=torch.float32 if self.args.cast_lm_head_to_fp32 else None)

    def _aggregations(self, inputs, mode: str):
        """The policy and entropy aggregations of ``_compute_loss`` for this micro-batch and mode."""
        accum = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if self.loss_type in ("grpo", "sapo"):
            policy = Aggregation("grpo", scale=1.0 / accum)
        elif self.loss_type == "bnpo":
            policy = Aggregation("bnpo", scale=1.0 / accum)
        elif self.loss_type == "dr_grpo":
            policy = Aggregation("dr_grpo", max_completion_length=self.max_completion_length, scale=1.0 / accum)
        else:  # dapo, cispo: num_items_in_batch spans the generation batch
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            policy = Aggregation("token-mean", global_tokens=float(normalizer))
        return policy, Aggregation("bnpo", scale=1.0 / accum)

    def _compute_loss(self, model, inputs):
        present = [k for k in MULTIMODAL_KEYS if inputs.get(k) is not None]
        if present:
            raise UnsupportedOption(f"FusedGRPOTrainer does not support multimodal inputs ({present[0]})")
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        C = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        mode = "train" if self.model.training else "eval"
        policy, entropy = self._aggregations(inputs, mode)
        loss_fn = FusedLinearGRPOLoss(self._loss_settings(), policy, entropy_aggregation=entropy)
        pg_scale = None
        if self.use_vllm and self.vllm_importance_sampling_correction:
            pg_scale = inputs["importance_sampling_ratio"]
        completions = Completions(completion_ids, mask, inputs["advantages"],
                                  old_logp=inputs.get("old_per_token_logps"),
                                  ref_logp=inputs.get("ref_per_token_logps") if self.beta != 0.0 else None,
                                  pg_scale=pg_scale)

        def fused(hidden, weight, bias):
            # position t's state predicts token t + 1: the completion's C tokens come from the C states
            # before them (TRL's log_probs[:, -logits_to_keep:] after its shift)
            h = hidden[:, -C - 1:-1]
            if self.args.cast_lm_head_to_fp32:
                h = h.float()
            return loss_fn(h, weight, completions, bias=bias)

        with self.accelerator.autocast():
            loss, stats = model(input_ids=input_ids, attention_mask=attention_mask, fused_policy_loss=fused)
        self._log_loss_stats(stats, mode, policy.scale)
        return loss

    def _log_loss_stats(self, stats, mode: str, accumulation_scale: float) -> None:
        """TRL's metrics of this micro-batch as 0-d device tensors (no host sync; ``log`` converts)."""
        stats = {k: v.detach() for k, v in stats.items()}
        tokens = stats["tokens"]
        names = ["entropy_mean", "kl", "clip_low_frac", "clip_high_frac"]
        totals = self.accelerator.reduce(torch.stack([stats[n] * tokens for n in names] + [tokens]), reduction="sum")
        entropy, kl, low, high = totals[:4] / totals[4].clamp(min=1.0)
        metrics = self._metrics[mode]
        if self._entropy_bonus_enabled:
            # TRL's policy_loss is the policy (+ KL) aggregate before its accumulation divisor, which
            # the grpo-family weights here carry (1 for dapo and cispo: theirs is in the normaliser)
            metrics["policy_loss"].append(self.accelerator.gather(stats["policy_loss"].reshape(1)).nanmean()
                                          / accumulation_scale)
            if mode == "train" and self.accelerator.sync_gradients:
                metrics["entropy_coef"].append(self.entropy_coef)
        if self.beta != 0.0:
            metrics["kl"].append(kl)
        metrics["entropy"].append(entropy)
        if self.loss_type == "cispo":
            metrics["cispo_clip_ratio"].append(high)
        elif self.loss_type != "sapo":
            metrics["clip_ratio/low_mean"].append(low)
            metrics["clip_ratio/high_mean"].append(high)
            metrics["clip_ratio/region_mean"].append(low + high)
            # per-sequence extremes over all processes; a process without tokens has no sequence
            extremes = self.accelerator.gather(torch.stack([stats["clip_low_seq_min"], stats["clip_high_seq_max"],
                                                            tokens]).unsqueeze(0)).reshape(-1, 3)
            present = extremes[:, 2] > 0
            inf = torch.full_like(extremes[:, 0], float("inf"))
            low_min = torch.where(present, extremes[:, 0], inf).amin()
            high_max = torch.where(present, extremes[:, 1], -inf).amax()
            nan = torch.full_like(low_min, float("nan"))
            metrics["clip_ratio/low_min"].append(torch.where(present.any(), low_min, nan))
            metrics["clip_ratio/high_max"].append(torch.where(present.any(), high_max, nan))

    def log(self, logs, start_time=None):
        """TRL's ``log``, after this trainer's device-side metrics become numbers (one host transfer)."""
        for metrics in self._metrics.values():
            pending = [(key, i) for key, values in metrics.items() for i, v in enumerate(values)
                       if isinstance(v, torch.Tensor)]
            if pending:
                numbers = torch.stack([metrics[k][i].float().reshape(()) for k, i in pending]).tolist()
                for (key, i), number in zip(pending, numbers, strict=True):
                    metrics[key][i] = number
        return super().log(logs, start_time)
