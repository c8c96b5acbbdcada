"""Continuous batching on the colocated vLLM engine: requests join the running batch between engine
steps and leave it the step they finish.

:class:`VLLMStepFront` drives the V1 ``LLMEngine`` inside a :class:`~mopd.rollout.vllm_engine.VLLMEngine`
(the engine core stays in this process, so ``load_weights`` and sleep/wake keep working between
rollouts) from one worker thread:

1. every newly submitted request is added to the engine (``LLM.enqueue`` on vLLM >= 0.12, which
   renders token prompts and marks the request final-output-only; ``LLMEngine.add_request`` with
   a ``{"prompt_token_ids": ...}`` prompt before it);
2. one ``LLMEngine.step()`` runs: vLLM's scheduler decodes every running sequence and prefills the
   new ones (chunked), reusing cached prefix blocks, so a Searcher's next turn prefills only its new
   tokens while its earlier turns' blocks are still cached;
3. each request that finished resolves its future (n > 1: vLLM returns the parent request's n
   samples together, in sample order).

A request carries the engine's LoRA adapter of the moment it is added (``VLLMEngine.lora_request``,
set by ``load_adapter`` between rollouts), as ``generate``'s requests do.

A run's next turn is submitted as soon as its completions (and searches) are in, so it enters the
batch at the next step instead of waiting for the slowest sequence of a lock-step batch.

Sampling: the request's seed goes to vLLM as a per-request seed, so a request samples the same
tokens whatever it shares a step with, up to vLLM's batch-dependent kernels (exact only with
vLLM's batch-invariant mode); the HF engine is the bit-exact reference.

vLLM is imported by the ``VLLMEngine`` that is wrapped, never here.
"""

from __future__ import annotations

import itertools
import time
from concurrent.futures import Future
from typing import Dict, Tuple

import torch

from mopd.core.generation import GenerationRequest
from mopd.rollout.engine_worker import cuda_device_keeper
from mopd.rollout.rollout_stats import BusyMeter
from mopd.rollout.vllm_outputs import completion_from_output
from mopd.rollout.work_queue import FrontClosed, WorkQueue


def output_request_id(added_id: str) -> str:
    """The id that the engine's outputs (and ``abort_request``) carry for a request ``LLM.enqueue``
    added under ``added_id``.

    ``LLM`` names its requests by a counter (``"0"``, ``"1"``, ...), but ``enqueue`` returns the
    engine's internal id: vLLM 0.32's ``InputProcessor.assign_request_id`` appends ``-`` and 8
    random characters to keep ids unique, while the outputs keep the counter's id. A front that
    waited for the internal id would never see its request finish. The counter's id has no ``-``,
    so it is everything before the first one (an id without one is already it).
    """
    return added_id.split("-", 1)[0]


def cpu_threads_keeper():
    """A function that gives the calling thread the intra-op thread count of this one.

    vLLM's CPU attention sizes its scheduling metadata by OpenMP's thread count in the thread that
    steps the engine, and checks it inside the kernel against torch's count. A new thread starts at
    OpenMP's default (the machine's cores) while torch reports the process-wide count, so a front
    stepping the engine from its own thread failed with "Check failed:
    input->metadata->thread_num == thread_num (2 vs. 1)" wherever the caller had set its own
    count (the trainer does: trainer.cpu_threads). vLLM's CPU worker replaces
    ``torch.set_num_threads`` with a no-op once it has bound its threads, hence ``torch._C``'s
    setter. Harmless for a GPU engine.
    """
    threads = torch.get_num_threads()
    setter = getattr(torch._C, "set_num_threads", None)   # torch.set_num_threads before vLLM replaced it
    if setter is None:
        return lambda: None
    return lambda: setter(threads)


class VLLMStepFront(WorkQueue):
    def __init__(self, engine, *, name: str = "mopd-vllm"):
        self.engine = engine
        self.llm = engine.llm
        self.tokenizer = engine.tokenizer
        self.meter = BusyMeter()
        self._ids = itertools.count()
        self._running: Dict[str, Tuple[Future, float, int]] = {}
        WorkQueue.__init__(self, "request")
        on_device, on_threads = cuda_device_keeper(), cpu_threads_keeper()
        self.start_workers(name, on_worker=lambda: (on_device(), on_threads()))

    def _add(self, request: GenerationRequest) -> str:
        params = self.engine._params(request.params)
        prompt = {"prompt_token_ids": list(request.prompt_ids)}
        adapter = getattr(self.engine, "lora_request", None)       # the engine's current LoRA adapter
        lora = {} if adapter is None else {"lora_request": adapter}
        if hasattr(self.llm, "enqueue"):
            return output_request_id(self.llm.enqueue([prompt], [params], use_tqdm=False, **lora)[0])
        from vllm.sampling_params import RequestOutputKind

        params.output_kind = RequestOutputKind.FINAL_ONLY
        request_id = f"mopd-{next(self._ids)}"
        self.llm.llm_engine.add_request(request_id, prompt, params, **lora)
        return request_id

    def _admit(self) -> bool:
        """Move pending requests into the engine; False once closed."""
        with self._cv:
            while not self._pending and not self._running and not self._closed:
                self._cv.wait()
            if self._closed:
                return False
            new = self.take_all()
        for request, fut, submitted in new:
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                self._running[self._add(request)] = (fut, submitted, request.params.n)
            except BaseException as e:
                fut.set_exception(e)
        return True

    def _loop(self) -> None:
        engine = self.llm.llm_engine
        try:
            while self._admit():
                if not self._running:
                    continue
                rows = sum(n for _, _, n in self._running.values())
                start = time.perf_counter()
                try:
                    outputs = engine.step()
                except BaseException as e:
                    self._fail_running(e)
                    continue
                end = time.perf_counter()
                self.meter.work(end - start, rows)
                for out in outputs:
                    if not out.finished or out.request_id not in self._running:
                        continue
                    fut, submitted, _ = self._running.pop(out.request_id)
                    self.meter.wait(end - submitted)
                    try:
                        fut.set_result([completion_from_output(o, self.tokenizer) for o in out.outputs])
                    except BaseException as e:
                        fut.set_exception(e)
        finally:
            self._abort_running()

    def _fail_running(self, error: BaseException) -> None:
        running, self._running = self._running, {}
        for fut, _, _ in running.values():
            fut.set_exception(error)

    def _abort_running(self) -> None:
        """Take unfinished requests out of the engine (it is reused after the rollout)."""
        if self._running:
            ids = list(self._running)
            try:
                self.llm.llm_engine.abort_request(ids)
            finally:
                self._fail_running(FrontClosed("the rollout ended before this request finished"))
