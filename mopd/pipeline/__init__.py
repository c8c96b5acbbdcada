"""The run's stages in one place: Stage I, the teacher export, the Stage II arms and their exports,
the evaluation of every system and the report, each reused when done and resumed when killed.

- :mod:`mopd.pipeline.config`: what a pipeline is (nested dataclasses, checked);
- :mod:`mopd.pipeline.presets`: the named pipelines (``paper``, ``demo``, ``demo_quick``) and
  their resolution (preset, YAML file, dotted overrides);
- :mod:`mopd.recipes.tiny_world.pipeline`: the demo's settings and the pipeline they make;
- :mod:`mopd.pipeline.stages`: each stage's inputs, outputs, done-marker and `mopd ...` command;
- :mod:`mopd.pipeline.footprint`: memory per GPU and disk of each stage, before anything loads;
- :mod:`mopd.pipeline.inprocess`: stages run in this process and spawned workers (CPU runs);
- :mod:`mopd.pipeline.run`: the run itself (in-process or one command per stage) and ``--dry-run``.

`mopd demo` and `mopd pipeline paper` are presets of it.
"""
