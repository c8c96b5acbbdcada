"""VLLMEngine: vLLM's offline ``LLM``, colocated with the trainer on the same GPUs.

Targets vLLM 0.10.2 - 0.11.x (the V1 engine: ``logprobs_mode``, token prompts, sleep mode, the
in-process engine core). vLLM is imported only when this engine is built; without it, building it
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
- Weight sync: ``load_weights`` hands the trainer's (name, tensor) pairs, Hugging Face names, to
  the model's own ``load_weights`` inside the engine (which shards them for tensor parallelism)
  and resets the prefix cache, whose entries were computed with the old weights. This needs the
  engine core in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set before vLLM is
  imported; tensor parallel > 1 uses ``distributed_executor_backend="external_launcher"`` (one
  engine per torchrun rank, as TRL's colocate mode).
- ``sleep()``: ``LLM.sleep(level)`` (1: weights to CPU and KV cache freed; 2: both freed, only safe
  when ``load_weights`` follows every ``wake()``); ``wake()``: ``LLM.wake_up()``.
"""

from __future__ import annotations

import os
from typing import Iterable, List, Optional, Sequence

from mopd.rollout.engine import Completion, GenerationRequest

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


def completion_from_output(output, tokenizer) -> Completion:
    """A vLLM ``CompletionOutput`` (token_ids, per-token {id: Logprob} dicts, finish_reason) as ours."""
    ids = [int(t) for t in output.token_ids]
    logprobs: List[float] = []
    for tid, entry in zip(ids, output.logprobs or []):
        lp = entry[tid]
        logprobs.append(float(getattr(lp, "logprob", lp)))
    if len(logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens; request logprobs=0")
    reason = output.finish_reason if output.finish_reason in ("stop", "length") else "stop"
    return Completion(token_ids=ids, logprobs=logprobs, finish_reason=reason,
                      text=tokenizer.decode(ids, skip_special_tokens=True))


class VLLMEngine:
    def __init__(self, model_path: str, *, gpu_memory_utilization: float = 0.5, tensor_parallel_size: int = 1,
                 dtype: str = "auto", seed: int = 0, max_model_len: Optional[int] = None, sleep_level: int = 1,
                 enable_sleep_mode: bool = True):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self._vllm = import_vllm()
        kwargs = {"model": model_path, "gpu_memory_utilization": gpu_memory_utilization,
                  "tensor_parallel_size": tensor_parallel_size, "dtype": dtype, "seed": seed,
                  "enable_sleep_mode": enable_sleep_mode, "logprobs_mode": "processed_logprobs"}
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if tensor_parallel_size > 1:
            kwargs["distributed_executor_backend"] = "external_launcher"
        self.llm = self._vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.sleep_level = sleep_level
        self._asleep = False

    def _params(self, p):
        return self._vllm.SamplingParams(
            n=p.n, temperature=p.temperature, top_p=p.top_p, max_tokens=p.max_new_tokens,
            stop=list(p.stop) or None, seed=p.seed, logprobs=0, include_stop_str_in_output=True)

    def generate(self, requests: Sequence[GenerationRequest]) -> List[List[Completion]]:
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        outputs = self.llm.generate(prompts, [self._params(r.params) for r in requests], use_tqdm=False)
        return [[completion_from_output(o, self.tokenizer) for o in out.outputs] for out in outputs]

    def _model(self):
        executor = self.llm.llm_engine.model_executor
        worker = executor.driver_worker
        worker = getattr(worker, "worker", worker)  # V1 wraps the worker
        return worker.model_runner.model

    def load_weights(self, named_tensors: Iterable) -> None:
        self._model().load_weights(list(named_tensors))
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        if not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
