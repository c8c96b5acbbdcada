"""The kinds of stage a pipeline can hold beyond training, export and evaluation, and the kinds of
report it can end with: registries that recipes add to.

- A **setup stage kind** builds what the training stages read (a world, a base model) before
  Stage I, in this process. It is a :class:`mopd.pipeline.stages.Stage` subclass registered with
  :func:`register_stage_kind`, with a classmethod ``check_settings(settings)`` (raise ValueError on
  a bad KEY=VALUE: it runs when the config is checked, before anything is built), a classmethod
  ``build(cfg, key, settings)`` returning the stage (``key``: its name in ``cfg.setup``), and ``run(self, ctx)`` (``ctx``: the in-process
  runner, with ``cfg``, ``root`` and ``log``), which returns what the report writer is given.
- A **report kind** writes the pipeline's report: a function ``(stage, setup_results, log) ->
  path of report.md`` registered with :func:`register_report_kind` (``setup_results``: what each
  setup stage's ``run`` returned, by its key; empty under the subprocess launcher). ``eval`` (`mopd eval report`)
  is the core's; a recipe adds its own.

Both registries load the recipes before they are read (:mod:`mopd.core.registry`), so a pipeline
file naming a recipe's kind works in any process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict

from mopd.config import ConfigError
from mopd.core.registry import Registry
from mopd.eval.report import ReportOptions, report_runs

STAGE_KINDS: Registry = Registry("setup stage kind", error=ConfigError)
"""Setup stage kinds by name (see the module docstring)."""
REPORT_KINDS: Registry = Registry("report kind", error=ConfigError)
"""Report writers by name (see the module docstring)."""


def register_stage_kind(name: str):
    """Class decorator: register a setup stage kind under ``name``."""
    return STAGE_KINDS.register(name)


def register_report_kind(name: str):
    """Function decorator: register a report writer under ``name``."""
    return REPORT_KINDS.register(name)


def _lookup(registry: Registry, name: str, where: str):
    try:
        return registry.lookup(name)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def stage_kind(name: str, where: str = "setup.kind") -> type:
    """The setup stage kind registered as ``name`` (a one-line ConfigError naming the kinds if none)."""
    return _lookup(STAGE_KINDS, name, where)


def report_kind(name: str, where: str = "report.kind") -> Callable:
    """The report writer registered as ``name`` (a one-line ConfigError naming the kinds if none)."""
    return _lookup(REPORT_KINDS, name, where)


def check_setup(cfg) -> None:
    """Every setup stage of ``cfg`` names a registered kind and its settings parse."""
    for key, s in cfg.setup.items():
        kind = stage_kind(s.kind, f"setup.{key}.kind")
        try:
            kind.check_settings(list(s.settings))
        except ValueError as e:
            raise ConfigError(f"setup.{key}: {e}") from None


@register_report_kind("eval")
def eval_report(stage, setup_results: Dict[str, object], log) -> Path:
    """`mopd eval report`: metrics, paired intervals against the reference, costs, curves."""
    return report_runs([e.out for e in stage.evals], stage.out, ReportOptions(
        names=stage.names, reference=stage.reference, draws=stage.draws, validation_logs=stage.logs,
        validation_labels=stage.labels, title=stage.heading, top_sections=report_sections(stage.sections)))


def report_sections(paths) -> str:
    """The markdown of the report sections a pipeline's stages wrote (the teacher check's), joined;
    a file not written (its stage left out) is skipped."""
    return "\n".join(Path(p).read_text(encoding="utf-8") for p in paths if Path(p).is_file())
