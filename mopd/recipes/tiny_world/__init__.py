"""The built-in tiny world: a seeded search-QA world small enough to train the whole method on a
laptop CPU, and `mopd demo`, which runs the method on it end to end.

What it holds (each module one concept):

- the world: :mod:`.world_kb` (invented bands, companies, towns, rivers), :mod:`.world_text`
  (passages and questions), :mod:`.world` (build it, its splits and index);
- its policies: :mod:`.scripted_policy` (a scripted team that plays every role, reading prompts
  through :mod:`.prompt_reader`), :mod:`.tiny_model` (a random small Qwen3 with its own tokenizer),
  :mod:`.warmstart` (pi_0: SFT on the scripted team's demonstrations), :mod:`.policy_check` (is a
  pi_0 good enough to train from);
- the method on it: :mod:`.presets` (``tiny_*``: the paper's presets scaled to the 0.7M model),
  :mod:`.pipeline` (`mopd demo`'s settings and pipeline), :mod:`.stages` (the world, pi_0 and
  its check as pipeline stages; the claims report), :mod:`.demo` (run it, over seeds),
  :mod:`.report`, :mod:`.seed_summary` and :mod:`.tables` (its claims, the multi-seed summary and
  the docs' tables);
- :mod:`.commands`: `mopd demo`, `mopd demo-docs`, `mopd world ...`, `mopd model init-tiny`.

Importing the package registers its presets, pipeline presets, stage kinds and report kind; the
core finds it through :func:`mopd.core.recipes.load_recipes`.
"""

from mopd.recipes.tiny_world import pipeline, presets, stages  # noqa: F401  (registration)
