"""Loading the policy and teacher, FSDP2 wrapping, and the packed forward to hidden states.

The lm-head is never applied here: callers pass the final hidden states and the lm-head weight
to ``mopd_kernels`` (``linear_logprobs`` for no-grad scoring, ``fused_linear_policy_loss`` for
the update), so full ``[tokens, vocab]`` logits are never materialised.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch import nn

from mopd.core.model_dir import remote_code_trusted
from mopd.train.packing import PackedBatch

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """The model or tokenizer could not be loaded (message says which path and why)."""


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def flash_attn_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


CPU_AUTO_ATTN = "packed_sdpa"
"""What ``auto`` runs on CPU: the packed rows, attention per call (bench/RESULTS.md, "Packed attention
without flash-attn": 1.17x faster updates and 1.25x faster scoring than the padded SDPA batch on
SmolLM2-135M, 39% less activation memory). A recipe's presets may pin the padded ``sdpa``, which
their published bits were made with."""


def choose_attn(attn: str, device: torch.device) -> str:
    """The transformers attention implementation for ``model.attn_implementation=attn`` on ``device``.

    ``auto``: on CUDA flash-attn's varlen kernel when flash-attn is installed, else torch's own
    varlen_attn (torch 2.10+), else the padded SDPA batch; on CPU ``CPU_AUTO_ATTN``. A choice the
    machine cannot run is refused in one line (ModelLoadError)."""
    from mopd.train import packed_attention as pa

    on_cuda = device.type == "cuda"
    if attn == "auto" and on_cuda:
        if flash_attn_available():
            return "flash_attention_2"
        return pa.VARLEN if pa.varlen_available() else "sdpa"
    if attn == "auto":
        attn = CPU_AUTO_ATTN
    if attn == "flash":
        if not (on_cuda and flash_attn_available()):
            raise ModelLoadError("model.attn_implementation=flash needs CUDA and flash-attn "
                                 "(pip install 'multiagent-opd[gpu]')")
        return "flash_attention_2"
    if attn == "varlen":
        if not (on_cuda and pa.varlen_available()):
            raise ModelLoadError(f"model.attn_implementation=varlen needs a CUDA device and torch>=2.10 "
                                 f"(torch.nn.attention.varlen); here: device {device.type}, torch {torch.__version__}: "
                                 f"use auto, packed_sdpa or flex")
        return pa.VARLEN
    return {"flex": pa.FLEX, "packed_sdpa": pa.SEGMENTS}.get(attn, attn)


def load_causal_lm(path: str, *, dtype: torch.dtype, device: torch.device, attn: str = "auto",
                   use_liger: bool = False) -> Tuple[nn.Module, object]:
    """Load a Hugging Face causal LM and its tokenizer from a local directory (or the HF cache).

    A LoRA adapter directory (``mopd export --adapter``, or any PEFT adapter) loads as its base
    model with the adapter merged into the weights (the base must still be the one it was trained
    over: :func:`mopd.core.adapter_dir.adapter_of`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mopd.core.adapter_dir import AdapterDirError, adapter_of
    from mopd.train import lora, packed_attention

    try:
        adapter = adapter_of(path)   # None for a full model; the base checked by its weights
    except AdapterDirError as e:
        raise ModelLoadError(str(e)) from None
    if adapter is not None:
        base = adapter.base_dir
        model, tok = load_causal_lm(base, dtype=dtype, device=device, attn=attn, use_liger=use_liger)
        try:
            return lora.merge_adapter(model, path), tok
        except (AdapterDirError, lora.LoraError) as e:
            raise ModelLoadError(str(e)) from None

    attn = choose_attn(attn, device)
    if attn in packed_attention.NAMES:
        packed_attention.register()
    if not Path(path).exists() and "/" not in path:
        raise ModelLoadError(f"model path {path!r} does not exist")
    if use_liger and device.type == "cuda":
        _apply_liger(path)
    from mopd.core.model_weights import load_failure, tokenizer_problem

    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=remote_code_trusted())
    except OSError as e:
        raise ModelLoadError(f"cannot load model from {path!r}: {e}") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn,
                                                     trust_remote_code=remote_code_trusted())
    except OSError as e:
        raise ModelLoadError(f"cannot load model from {path!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 (a truncated safetensors file, a config.json of another size, ...)
        raise ModelLoadError(load_failure(path, e)) from None
    # A token without an embedding row: an index error on CPU, another row's memory on a GPU.
    problem = tokenizer_problem(path, len(tok), model.get_input_embeddings().num_embeddings)
    if problem:
        raise ModelLoadError(problem)
    model.to(device)
    model.config.use_cache = False
    return model, tok


def _apply_liger(path: str) -> None:
    """Patch Liger's RMSNorm/SwiGLU/RoPE into the model class (not its fused CE: our loss head is ours)."""
    if importlib.util.find_spec("liger_kernel") is None:
        log.info("liger-kernel is not installed; using the stock transformer kernels")
        return
    try:
        from liger_kernel.transformers import _apply_liger_kernel
        from transformers import AutoConfig

        model_type = AutoConfig.from_pretrained(path, trust_remote_code=remote_code_trusted()).model_type
        _apply_liger_kernel(model_type, rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                            fused_linear_cross_entropy=False)
    except Exception as e:  # an unsupported architecture keeps the stock kernels
        log.warning("Liger kernels not applied (%s); using the stock kernels", e)


def lm_head_weight(model: nn.Module) -> torch.Tensor:
    return model.get_output_embeddings().weight


def flash_varlen_kwargs(batch: PackedBatch) -> dict:
    """The sequence boundaries in the form transformers hands straight to ``flash_attn_varlen_func``.

    Given only ``position_ids``, every attention layer re-derives ``cu_seqlens`` and the maximum
    length from them, a device-to-host copy per layer (36 per forward for Qwen3-4B). Here the
    maximum is read once per micro-batch (from host memory when the batch is still there).
    """
    cu = batch.cu_seqlens.to(device=batch.input_ids.device, dtype=torch.int32)
    max_len = int((batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).max())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max_len, "max_length_k": max_len}


def packed_hidden(model: nn.Module, batch: PackedBatch) -> torch.Tensor:
    """Final hidden states [L, H] of a packed micro-batch, each sequence attending only to itself.

    Packed (one [1, L] row, no padding; restarting position ids for RoPE): flash-attn's varlen
    kernel, or one of ``mopd.train.packed_attention``'s (torch's varlen_attn, FlexAttention,
    per-call SDPA), each handed the boundaries computed once here. Otherwise (``sdpa``,
    ``eager``) the sequences are laid out as a right-padded [S, max_len] batch and unpadded
    afterwards: every layer then also runs on S * max_len - L padding tokens.
    """
    from mopd.train import packed_attention

    impl = getattr(model.config, "_attn_implementation", "sdpa")
    if impl == "flash_attention_2":
        out = model.model(input_ids=batch.input_ids[None], position_ids=batch.position_ids[None], use_cache=False,
                          **flash_varlen_kwargs(batch))
        return out.last_hidden_state[0]
    if impl in packed_attention.NAMES:
        kwargs = packed_attention.packed_kwargs(impl, batch.cu_seqlens, batch.input_ids.device)
        out = model.model(input_ids=batch.input_ids[None], position_ids=batch.position_ids[None], use_cache=False,
                          **kwargs)
        return out.last_hidden_state[0]
    lengths = (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).tolist()
    if len(lengths) == 1:
        out = model.model(input_ids=batch.input_ids[None], use_cache=False)
        return out.last_hidden_state[0]
    width = max(lengths)
    device = batch.input_ids.device
    rows = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                   torch.tensor(lengths, device=device))
    cols = batch.position_ids
    ids = torch.zeros(len(lengths), width, dtype=batch.input_ids.dtype, device=device)
    ids[rows, cols] = batch.input_ids
    mask = torch.zeros(len(lengths), width, dtype=torch.long, device=device)
    mask[rows, cols] = 1
    out = model.model(input_ids=ids, attention_mask=mask, use_cache=False)
    return out.last_hidden_state[rows, cols]


class PackedCausalLM(nn.Module):
    """A causal LM whose lm-head step is one of our kernels, run inside this module's forward.

    Under FSDP2 this wrapper is the root: the embedding (tied to the lm-head) and the final norm
    are unsharded for the whole forward, kernels included, and their gradients are reduced by the
    root's post-backward hooks, exactly as if the lm-head were an ordinary layer.
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, batch: PackedBatch, loss=None, *, temperature: float = 1.0, normalizer=None):
        """Without ``loss``: log pi(target | history) of every position at ``temperature``, fp32 [L]
        (no-grad scoring of pi_old, the teacher, the reference). With ``loss`` (a
        ``mopd_kernels.FusedLinearPolicyLoss``, which holds its own temperature): ``(loss, stats)`` of
        the batch's loss inputs (``PackedBatch.loss_inputs``), normalised by ``normalizer``."""
        hidden = packed_hidden(self.lm, batch)
        weight = lm_head_weight(self.lm)
        if loss is None:
            from mopd_kernels import linear_logprobs

            logp, _ = linear_logprobs(hidden, weight, batch.targets, temperature=temperature, with_entropy=False)
            return logp.float()
        return loss(hidden, weight, batch.targets, batch.loss_inputs(), normalizer)


def policy_loss_head(cfg):
    """The fused PPO/OPD loss with this run's hyperparameters (role specs, clip, temperature). A
    training run is a long job: the compiled CPU row pass is worth its first-call compilation
    (``MOPD_KERNELS_COMPILE=0`` keeps the eager one), so a trainer turns it on when it is built (a
    process-wide setting of ``mopd_kernels``; never flipped inside the loop)."""
    from mopd_kernels import FusedLinearPolicyLoss, PolicyLossSettings, set_compiled_cpu_rows

    from mopd.algo.advantages import role_specs

    set_compiled_cpu_rows(True)
    return FusedLinearPolicyLoss(PolicyLossSettings(
        role_specs=tuple(role_specs(cfg.algo)), clip_low=cfg.algo.clip_low, clip_high=cfg.algo.clip_high,
        dual_clip=cfg.algo.dual_clip, temperature=cfg.rollout.temperature))


def master_dtype(name: str, device: torch.device, sharded: bool) -> torch.dtype:
    """The dtype the trainer loads (and AdamW updates) its parameters in.

    ``auto`` under FSDP2 on CUDA is fp32: the master weights and AdamW's moments stay fp32 while
    the forward/backward compute in bf16 (``MixedPrecisionPolicy``). bf16 master weights lose most
    small updates to rounding: at lr 1e-6 on weights of size ~0.02, an AdamW step of ~1e-6 is
    below bf16's half-ulp (~6e-5) and vanishes (measured on CPU: 67x less movement over 20 steps).
    """
    if name == "auto" and sharded and device.type == "cuda":
        return torch.float32
    return resolve_dtype(name, device)


def policy_dtype(name: str, device: torch.device, sharded: bool, *, frozen_base: bool = False) -> torch.dtype:
    """The dtype the policy's weights are loaded in: the master dtype in full fine-tuning
    (:func:`master_dtype`); with a frozen base (LoRA: ``RunModels.trains_adapters``) the compute
    dtype (nothing to keep small updates for: the adapters, created in fp32, are the masters)."""
    if frozen_base:
        return resolve_dtype(name, device)
    return master_dtype(name, device, sharded)


def mixed_precision_policies(enabled: bool):
    """(per-layer, root) FSDP2 policies: bf16 compute, fp32 gradient reduction.

    The root (the module whose forward receives the loss inputs: pi_old, advantages, teacher
    log-probs) does not cast its forward inputs, so they reach the loss kernel in fp32 exactly:
    a bf16 cast would move a log-prob of -12 by up to 0.03 and start the PPO ratio up to 3% from 1.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not enabled:
        return None, None
    layer = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    root = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    return layer, root


def shard_model(model: nn.Module, device: torch.device, mixed_precision: Optional[bool] = None,
                activation_checkpointing: Optional[bool] = None, reshard_after_forward: bool = True,
                root: Optional[nn.Module] = None, reshard_root_after_forward: bool = False) -> nn.Module:
    """FSDP2: ``fully_shard`` every decoder layer of ``model``, then ``root`` (default the model
    itself; the PackedCausalLM wrapper in training).

    - ``mixed_precision`` (None: on for CUDA): bf16 compute over the fp32 parameters it finds,
      fp32 gradient reduction, the root's inputs left uncast (see ``mixed_precision_policies``).
    - ``activation_checkpointing`` (None: on for CUDA): each decoder layer recomputed in backward.
    - The root is not resharded after forward: it holds the embedding (tied to the lm-head) and
      the final norm, which backward needs again at once; resharding would all-gather the
      embedding twice per micro-batch to save ~0.8 GB (Qwen3-4B, bf16) for a moment. (A
      no-grad scorer, which has no backward, passes ``reshard_root_after_forward=True``.)
    - Gradients are summed over ranks, not averaged: the loss is already divided by the global
      number of trained tokens (all-reduced), so a sum is the global token mean. FSDP2's default
      divides by the world size once more, which would make every update world-size times
      smaller than the single-process one.
    """
    from torch.distributed.fsdp import fully_shard

    on_gpu = device.type == "cuda"
    root = root if root is not None else model
    layers = _decoder_layers(model)
    if on_gpu if activation_checkpointing is None else activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, layer in enumerate(layers):
            layers[i] = checkpoint_wrapper(layer)
    layer_mp, root_mp = mixed_precision_policies(on_gpu if mixed_precision is None else mixed_precision)
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward,
                    **({"mp_policy": layer_mp} if layer_mp is not None else {}))
    fully_shard(root, reshard_after_forward=reshard_root_after_forward,
                **({"mp_policy": root_mp} if root_mp is not None else {}))
    for module in [*layers, root]:
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)   # a plain SUM (gloo has no PREMUL_SUM)
    return root


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ModelLoadError(f"{type(model).__name__} has no model.layers ModuleList; cannot shard it per layer")
    return layers


def check_same_tokenizer(student_tok, teacher_tok, teacher_path: Optional[str] = None) -> None:
    """OPD compares log-probs token by token: the vocabularies must be identical."""
    a, b = student_tok.get_vocab(), teacher_tok.get_vocab()
    if a != b:
        diff = len(set(a.items()) ^ set(b.items()))
        raise ModelLoadError(f"the teacher ({teacher_path}) does not share the student's tokenizer "
                             f"({len(a)} vs {len(b)} entries, {diff} differing): OPD needs identical vocabularies")
