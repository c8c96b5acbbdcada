"""``FusedGRPOTrainer``: TRL's ``GRPOTrainer`` with the fused lm-head policy loss.

    from mopd_kernels.integrations.trl import FusedGRPOTrainer
    trainer = FusedGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)

It takes exactly ``GRPOTrainer``'s arguments. TRL (1.16) scores completions with its chunked lm head
(``trl.trainer.utils.add_fused_lm_head``: log-probs and entropies tile by tile, recomputed for the
backward) and then computes the loss from them; here the model's forward returns the last hidden
states of the completion positions and ``FusedLinearGRPOLoss`` computes the loss *and* its
gradients in one pass over the vocabulary (three lm-head matmuls per token instead of four, no
``[B, T, V]`` logits, per-token terms in fp32). The loss is TRL's, term for term, for:

- ``loss_type`` ``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``cispo``, ``sapo``, ``luspo``, ``vespo`` (with
  their normalisations, gradient accumulation and ``num_items_in_batch`` included);
- ``beta`` (k3 KL to the reference model) with or without ``use_bias_correction_kl``;
- ``importance_sampling_level`` ``token`` or ``sequence`` (GSPO, with every loss type), ``epsilon``/
  ``epsilon_high``, ``delta`` (two-sided clipping), ``num_iterations`` (on-policy steps pass no old
  log-probs and cost nothing extra), the entropy bonus, static or adaptive (``use_adaptive_entropy``:
  TRL's controller, its state in the trainer's own attributes), ``top_entropy_quantile < 1`` (the
  entropy filter: every trained token's entropy is scored first, without a gradient, and TRL's own
  quantile across processes picks the tokens), ``off_policy_mask_threshold`` (DeepSeek-V3.2's sequence
  mask, inside the loss's sequence pass), ``tool_mask``, vLLM's importance-sampling correction,
  ``cast_lm_head_to_fp32``, ``temperature``, bf16/fp16 autocast;
- an lm head with a bias (its gradient included), or one that scales (Cohere's ``logit_scale``, the
  multipliers other families name otherwise) or soft-caps (Gemma 2's ``final_logit_softcapping``) its
  logits: applied inside the fused row pass;
- MoE models: the router's load-balancing loss (``router_aux_loss_coef``) added as TRL adds it, from the
  router logits the backbone's forward returns.

It refuses at construction, in one line naming the option, what it does not compute: ``delta <= 1 +
epsilon_high`` and a PEFT adapter on the lm head. Multimodal inputs are refused at the first batch.

Logged like TRL, with the same values on the same batch: ``entropy``, ``kl``, ``clip_ratio/low_mean``,
``high_mean``, ``region_mean`` (token means over all processes), ``clip_ratio/low_min`` / ``high_max``
(per-sequence extremes over all processes), ``cispo_clip_ratio``, ``vespo/phi_seq_mean``, ``aux_loss``,
and ``policy_loss`` and ``entropy_coef`` where the entropy bonus is on. Each micro-batch's values stay on the device (0-d
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
from mopd_kernels.ops import linear_logprobs
from mopd_kernels.roles import RoleSpec
from mopd_kernels.settings import PolicyLossSettings

SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
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
    delta = getattr(args, "delta", None)
    if delta is not None and not delta > 1.0 + trainer.epsilon_high:
        found.append(f"delta={delta} (two-sided clipping is supported for delta > 1 + epsilon_high = "
                     f"{1.0 + trainer.epsilon_high})")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        found.append("a model without an lm-head weight (get_output_embeddings)")
    elif type(head).__module__.startswith("peft"):
        found.append("a PEFT adapter on the lm head")
    return found


def logit_head(text_config) -> tuple:
    """``(logit_scale, final_logit_softcapping)`` of a model's lm head, read as the model applies them
    (and as TRL's chunked head reads them): the multiplier is ``logit_scale`` (Cohere), else
    ``output_multiplier``, else ``lm_head_multiplier`` (Falcon-H1), else ``1 / logits_scaling``
    (Granite, MiniCPM3; HyperCLOVA X multiplies by it instead); 1.0 when none is set."""
    scale = None
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        if scale is None:
            scale = getattr(text_config, name, None)
    scaling = getattr(text_config, "logits_scaling", None)
    if scale is None and scaling is not None:
        scale = scaling if getattr(text_config, "model_type", None) == "hyperclovax" else 1.0 / scaling
    return float(1.0 if scale is None else scale), getattr(text_config, "final_logit_softcapping", None)


def add_fused_policy_loss(model) -> None:
    """Patch ``model`` (as TRL's ``add_fused_lm_head`` does) so that ``model(..., fused_policy_loss=f)``
    runs the backbone and returns ``f(hidden_states, lm_head_weight, lm_head_bias, backbone_outputs)``
    (the outputs carry a MoE model's router logits); any other call is the model's own forward. The
    backbone and head are looked up per call (FSDP and PEFT replace them)."""
    previous = model.forward

    @functools.wraps(type(model).forward)
    def forward(self, *args, fused_policy_loss=None, **kwargs):
        if fused_policy_loss is None:
            return previous(*args, **kwargs)
        kwargs["use_cache"] = False
        outputs = self.base_model(*args, **kwargs)
        head = self.get_output_embeddings()
        return fused_policy_loss(outputs.last_hidden_state.to(head.weight.device), head.weight,
                                 getattr(head, "bias", None), outputs)

    model.forward = types.MethodType(forward, model)


def router_aux_loss(model, outputs, attention_mask) -> torch.Tensor:
    """A MoE model's load-balancing loss of this forward (transformers' Mixtral formula, which every MoE
    family shares, from the backbone's router logits), as the model's own forward and TRL compute it."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config.get_text_config()
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if experts is None:
        experts = getattr(base, "num_experts")
    return load_balancing_loss_func(outputs.router_logits, experts, config.num_experts_per_tok, attention_mask)


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

    def _entropy_coef_now(self) -> float:
        """The entropy bonus's coefficient for this micro-batch: the static one, or under adaptive control
        the coefficient of the last optimizer step while the measured entropy is at most the target (0
        above it), as TRL applies it."""
        if not self._entropy_bonus_enabled:
            return 0.0
        if self.use_adaptive_entropy and not self._last_world_entropy <= self.args.entropy_target:
            return 0.0
        return float(self.entropy_coef)

    def _loss_settings(self) -> PolicyLossSettings:
        objective = {"cispo": "cispo", "sapo": "sapo", "vespo": "vespo"}.get(self.loss_type, "ppo")
        spec = RoleSpec(kl_coef=float(self.beta), kl_type="k3", entropy_coef=self._entropy_coef_now(), name="policy")
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        scale, softcap = logit_head(base.config.get_text_config())
        args = self.args
        return PolicyLossSettings(
            [spec], clip_low=float(self.epsilon_low), clip_high=float(self.epsilon_high),
            dual_clip=getattr(self.args, "delta", None), temperature=float(self.temperature), objective=objective,
            importance_sampling=self.importance_sampling_level,
            kl_bias_correction=bool(self.beta != 0.0 and self.args.use_bias_correction_kl),
            cispo_max_weight=float(self.epsilon_high) if objective == "cispo" else None,
            sapo_temperatures=(float(self.args.sapo_temperature_pos), float(self.args.sapo_temperature_neg)),
            matmul_dtype=torch.float32 if self.args.cast_lm_head_to_fp32 else None, logit_scale=scale,
            logit_softcap=softcap, off_policy_threshold=self.off_policy_mask_threshold,
            vespo_params=(float(args.vespo_k_pos), float(args.vespo_lambda_pos), float(args.vespo_k_neg),
                          float(args.vespo_lambda_neg)))

    def _aggregations(self, inputs, mode: str):
        """The policy and entropy aggregations of ``_compute_loss`` for this micro-batch and mode."""
        accum = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if self.loss_type in ("grpo", "sapo"):
            policy = Aggregation("grpo", scale=1.0 / accum)
        elif self.loss_type == "bnpo":
            policy = Aggregation("bnpo", scale=1.0 / accum)
        elif self.loss_type == "dr_grpo":
            policy = Aggregation("dr_grpo", max_completion_length=self.max_completion_length, scale=1.0 / accum)
        elif self.loss_type == "luspo":
            policy = Aggregation("luspo", scale=1.0 / accum)
        else:  # dapo, cispo, vespo: num_items_in_batch spans the generation batch
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
        settings = self._loss_settings()
        loss_fn = FusedLinearGRPOLoss(settings, policy, entropy_aggregation=entropy)
        pg_scale = None
        if self.use_vllm and self.vllm_importance_sampling_correction:
            pg_scale = inputs["importance_sampling_ratio"]
        old_logp = inputs.get("old_per_token_logps")
        sampling_logp = None
        if self.off_policy_mask_threshold is not None:  # the sampler's log-probs (vLLM's), else pi_old's
            sampling_logp = inputs.get("sampling_per_token_logps", old_logp)
        kept = {}

        def fused(hidden, weight, bias, outputs):
            # position t's state predicts token t + 1: the completion's C tokens come from the C states
            # before them (TRL's log_probs[:, -logits_to_keep:] after its shift)
            h = hidden[:, -C - 1:-1]
            if self.args.cast_lm_head_to_fp32:
                h = h.float()
            high = None
            if self.top_entropy_quantile < 1.0:
                kept["entropies"] = self._completion_entropies(h, weight, bias, completion_ids, mask, settings)
                high = self.get_high_entropy_mask(kept["entropies"], mask, 1 - self.top_entropy_quantile)
            completions = Completions(completion_ids, mask, inputs["advantages"], old_logp=old_logp,
                                      ref_logp=inputs.get("ref_per_token_logps") if self.beta != 0.0 else None,
                                      pg_scale=pg_scale, sampling_logp=sampling_logp, entropy_filter=high)
            loss, stats = loss_fn(h, weight, completions, bias=bias)
            if self.aux_loss_enabled:
                kept["aux_loss"] = router_aux_loss(self.model, outputs, attention_mask)
            kept["high"] = high
            return loss, stats

        extra = {"output_router_logits": True} if self.aux_loss_enabled else {}
        with self.accelerator.autocast():
            loss, stats = model(input_ids=input_ids, attention_mask=attention_mask, fused_policy_loss=fused, **extra)
        if self.use_adaptive_entropy and mode == "train":
            effective = mask if kept["high"] is None else mask * kept["high"]
            self._update_adaptive_entropy(stats, kept.get("entropies"), effective)
        self._log_loss_stats(stats, mode, policy.scale, mask)
        if self.aux_loss_enabled:
            # the policy loss is already scaled for gradient accumulation, so the aux loss is too (TRL)
            accum = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.router_aux_loss_coef * kept["aux_loss"] / accum
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(
                kept["aux_loss"].detach().reshape(1)).mean())
        return loss

    def _completion_entropies(self, h, weight, bias, completion_ids, mask, settings) -> torch.Tensor:
        """Every trained completion token's entropy ``[B, C]`` (0 elsewhere), by the fused head without a
        gradient (one lm-head matmul per trained token, no logits kept): the entropy filter's input,
        which needs them all before the loss's gradient pass."""
        rows = mask.reshape(-1) != 0
        flat = h.reshape(-1, h.shape[-1])[rows]
        w, b = weight, bias
        if settings.matmul_dtype is not None:
            flat, w = flat.to(settings.matmul_dtype), w.to(settings.matmul_dtype)
            b = None if b is None else b.to(settings.matmul_dtype)
        with torch.no_grad(), torch.autocast(flat.device.type, enabled=settings.matmul_dtype is None):
            _, ent = linear_logprobs(flat.detach(), w.detach(), completion_ids.reshape(-1)[rows],
                                     temperature=settings.temperature, bias=None if b is None else b.detach(),
                                     logit_scale=settings.logit_scale, logit_softcap=settings.logit_softcap)
        return torch.zeros(mask.shape, dtype=ent.dtype, device=ent.device).masked_scatter(mask != 0, ent)

    def _update_adaptive_entropy(self, stats, entropies, effective_mask) -> None:
        """TRL's adaptive entropy controller: this micro-batch's entropy sum and token count over the tokens
        the bonus acts on join the accumulation window; at the optimizer step the window's global mean moves
        the coefficient one ``entropy_coef_delta`` towards ``entropy_target`` (within its bounds) for the
        next step. One host sync per optimizer step, as TRL's."""
        if entropies is None:  # no entropy filter: the loss's own stats are over the same tokens
            window = torch.stack([stats["entropy_mean"] * stats["tokens"], stats["tokens"]]).detach()
        else:
            window = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach().float()
        self._entropy_window_stats = window if self._entropy_window_stats is None else self._entropy_window_stats + window
        if not self.accelerator.sync_gradients:
            return
        total = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
        world = (total[0] / total[1].clamp(min=1.0)).item()
        args = self.args
        if world <= args.entropy_target:
            self.entropy_coef = min(self.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
        else:
            self.entropy_coef = max(self.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
        self._last_world_entropy = world
        self._entropy_window_stats = None

    def _log_loss_stats(self, stats, mode: str, accumulation_scale: float, mask) -> None:
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
        elif self.loss_type == "vespo":
            # TRL's mean of phi over all completions: an empty one's phi is 1 (log w = 0)
            present = (mask.sum(-1) > 0).sum().to(tokens.dtype)
            rows = torch.tensor(float(mask.shape[0]), device=tokens.device)
            phi_sum = stats["seq_weight_mean"] * present + (rows - present)
            totals = self.accelerator.reduce(torch.stack([phi_sum, rows]), reduction="sum")
            metrics["vespo/phi_seq_mean"].append(totals[0] / totals[1].clamp(min=1.0))
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
