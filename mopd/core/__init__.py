"""The bottom layer: the terms every other package shares.

- ``mopd.core.records``: the workflow record and its JSONL I/O.
- ``mopd.core.scoring``: answer extraction and exact match.
- ``mopd.core.qa``: QA datasets (FlashRAG jsonl, Search-R1 parquet).
- ``mopd.core.roles``: the role table (name, id, prompt, stop strings, parser, advantage grouping,
  default reward).
- ``mopd.core.workflows``: the workflow table (name, roles, step limit).
- ``mopd.core.atomic``: atomic file writes; ``mopd.core.key_values``: KEY=VALUE settings.
- ``mopd.core.errors`` / ``mopd.core.arguments``: the CLI's error type and override argument.
- ``mopd.core.model_dir`` / ``mopd.core.out_path``: can a model directory be loaded, can an output
  directory be written (checked before anything loads).

It imports nothing of ours (``mopd.config`` reads its tables; ``tests/test_layering.py`` checks
it), and this ``__init__`` imports nothing at all, so reading a record does not pull in torch.
The command line imports the core before any handler runs (and before ``mopd.core.reproducible``
pins the CPU environment that torch reads when it loads), so its modules import torch,
transformers and pyarrow inside the functions that use them, never at module level.
"""
