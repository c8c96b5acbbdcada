"""Recipes: worlds and experiments that live beside the core, never inside it.

A recipe is a package here (or a module another distribution declares under the ``mopd.recipes``
entry-point group). Importing it registers what it brings: method presets
(:func:`mopd.config.register_preset`), pipeline presets, pipeline stage kinds and report kinds
(:mod:`mopd.pipeline.kinds`), and, in its optional ``commands`` module, its `mopd` commands.
Nothing in the core imports a recipe by name: :func:`mopd.core.recipes.load_recipes` finds them,
once per process, before any registry is read or the command line is built.

- :mod:`mopd.recipes.tiny_world`: the built-in tiny search-QA world, its scripted policy, the
  warm-started pi_0 and `mopd demo`.
"""
