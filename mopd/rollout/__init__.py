"""Rollout: inference engines and the C-MAS / H-MAS workflows as batched, token-exact environments.

Public API (import from the modules; this package imports nothing, so that reading records does
not pull in torch):

- ``mopd.rollout.async_scheduler.run_rollout(engine, retriever, tokenizer, questions, settings, *,
  attempts, method, progress)`` -> ``list[WorkflowRecord]`` with ``.stats`` (a
  ``rollout_stats.RolloutStats``): the entry point of training and evaluation. It runs
  ``run_workflows_async`` (every run advances on its own, the engine batches whatever turns are
  pending, retrieval overlaps generation) where that is faster (vLLM), else
  ``mopd.rollout.scheduler.run_workflows`` (lock-step rounds); both give the same records.
- ``mopd.rollout.engine``: ``SamplingParams``, ``GenerationRequest``, ``Completion``, ``Engine``,
  ``build_engine``; engines ``hf_engine.HFEngine``, ``vllm_engine.VLLMEngine``,
  ``scripted_engine.ScriptedEngine`` (replays texts: demonstrations, tests).
- ``mopd.rollout.prompts``: role prompts and the exact rendering of everything an agent reads;
  ``mopd.rollout.chat.continuation_ids`` appends an environment turn token-exactly.
- ``mopd.core.actions``: the action grammar's parsers.
- ``mopd.core.records``: the records themselves.
- ``mopd.data.tiny_model.init_tiny_model``: a random small Qwen3 model for tests and demos.
"""
