"""Rollout: inference engines and the C-MAS / H-MAS workflows as batched, token-exact environments.

Public API (import from the modules; this package imports nothing, so that reading records does
not pull in torch):

- ``mopd.rollout.scheduler.run_workflows(engine, retriever, tokenizer, questions, *, workflow, ...)``
  -> ``list[WorkflowRecord]``: the entry point of training and evaluation.
- ``mopd.rollout.engine``: ``SamplingParams``, ``GenerationRequest``, ``Completion``, ``Engine``,
  ``build_engine``; engines ``hf_engine.HFEngine``, ``vllm_engine.VLLMEngine``,
  ``scripted_engine.ScriptedEngine`` (replays texts: demonstrations, tests).
- ``mopd.rollout.prompts``: role prompts and the exact rendering of everything an agent reads;
  ``mopd.rollout.chat.continuation_ids`` appends an environment turn token-exactly.
- ``mopd.core.actions``: the action grammar's parsers.
- ``mopd.core.records``: the records themselves.
- ``mopd.data.tiny_model.init_tiny_model``: a random small Qwen3 model for tests and demos.
"""
