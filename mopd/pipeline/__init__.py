"""The run's stages in one place: Stage I, the teacher export, the Stage II arms and their exports,
the evaluation of every system and the report, each reused when done and resumed when killed.

- :mod:`mopd.pipeline.config`: what a pipeline is (nested dataclasses, checked);
- :mod:`mopd.pipeline.presets`: the named pipelines (``paper``; a recipe registers its own) and
  their resolution (preset, YAML file, dotted overrides);
- :mod:`mopd.pipeline.kinds`: the setup stage kinds and report kinds recipes add (a world, a base
  model, a report with claims);
- :mod:`mopd.pipeline.stages`: each stage's inputs, outputs, done-marker and `mopd ...` command;
- :mod:`mopd.pipeline.teacher_check`: Stage I's export against the base on dev per question type,
  before the arms distil it (its stages, table and warning);
- :mod:`mopd.pipeline.footprint`: memory per GPU and disk of each stage, before anything loads;
- :mod:`mopd.pipeline.inprocess`: stages run in this process and spawned workers (CPU runs);
- :mod:`mopd.pipeline.run`: the run itself (in-process or one command per stage) and ``--dry-run``.

The paper's GPU run (`mopd pipeline paper`) and the runs a recipe brings are presets of it.
"""
