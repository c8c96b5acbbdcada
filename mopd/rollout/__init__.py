"""Rollout: inference engines and the C-MAS / H-MAS workflows as batched, token-exact environments.

Public API (import from the modules; this package imports nothing, so that reading records does
not pull in torch):

- ``mopd.rollout.async_scheduler.run_rollout(engine, retriever, tokenizer, questions, settings, *,
  attempts, method, progress)`` -> ``list[WorkflowRecord]`` with ``.stats`` (a
  ``rollout_stats.RolloutStats``): the entry point of training and evaluation. It runs
  ``run_workflows_async`` (every run advances on its own, and every Searcher of an H-MAS wave on
  its own lane, ``lanes.py``; the engine batches whatever turns are pending, retrieval overlaps
  generation) where that is faster (vLLM), else
  ``mopd.rollout.scheduler.run_workflows`` (lock-step rounds); both give the same records.
- ``mopd.rollout.engine``: ``Engine`` (the protocol), ``build_engine`` (requests and completions
  are ``mopd.core.generation``'s); engines ``hf_engine.HFEngine``, ``vllm_engine.VLLMEngine``,
  ``scripted_engine.ScriptedEngine`` (replays texts: demonstrations, tests).
- ``mopd.rollout.prompts``: role prompts and the exact rendering of everything an agent reads;
  ``mopd.rollout.chat.continuation_ids`` appends an environment turn token-exactly.
- The action grammar (``mopd.core.actions``), the role table (``mopd.core.roles``) and the records
  (``mopd.core.records``) are the bottom layer's.
"""
