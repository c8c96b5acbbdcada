"""The tiny world's pipeline stages and its report, registered with the pipeline.

Three setup stage kinds run before Stage I, each reusing what it built (its own marker):

- ``tiny_world``: the world (corpus, knowledge base, questions, splits) and its retrieval index
  under ROOT/world. Settings: any :class:`~mopd.recipes.tiny_world.world.WorldSettings` field but
  seed (the pipeline's), and ``quick=true`` for the quick world of smoke runs.
- ``tiny_pi0``: pi_0, the SFT warm start on scripted demonstrations, at the pipeline's ``model``.
  Settings: any :class:`~mopd.recipes.tiny_world.warmstart.WarmStartSettings` field but seed, and
  ``threads=N`` (torch threads: results depend on it in the last bits).
- ``tiny_pi0_check``: pi_0's format validity and EM on dev (ROOT/pi0_check.json). Settings:
  ``attempts``, ``weak_em``, ``weak_valid`` (:class:`~mopd.recipes.tiny_world.policy_check.WeakPi0`).

The report kind ``claims`` is `mopd eval report`'s report with the demo's claims at its top and the
pi_0 check at its end (and, when a stage trained LoRA adapters, how each stage trained above them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from mopd.core.key_values import parse_key_values
from mopd.core.reproducible import deterministic_torch
from mopd.pipeline.kinds import register_report_kind, register_stage_kind, report_sections
from mopd.pipeline.stages import Stage
from mopd.recipes.tiny_world.pipeline import PI0_CHECK
from mopd.recipes.tiny_world.policy_check import WeakPi0, check_pi0_cached
from mopd.recipes.tiny_world.report import ReportInputs, training_note, write_report
from mopd.recipes.tiny_world.warmstart import build_pi0, parse_pi0_settings, read_pi0
from mopd.recipes.tiny_world import world
from mopd.recipes.tiny_world.world import parse_world_settings


def _split(items: Sequence[str], keys: Tuple[str, ...]) -> Tuple[List[str], List[str]]:
    """``items``' entries for ``keys`` (this stage's own settings) and the rest (the builder's)."""
    own = [it for it in items if str(it).partition("=")[0].strip() in keys]
    return own, [it for it in items if it not in own]


@dataclass(frozen=True)
class WorldOptions:
    quick: bool = False
    """The quick (smaller) world of smoke runs."""


@dataclass(frozen=True)
class Pi0Options:
    threads: int = 2
    """Torch threads of the warm start (results depend on it in the last bits)."""

    def __post_init__(self):
        if self.threads < 1:
            raise ValueError(f"threads={self.threads} must be > 0")


@register_stage_kind("tiny_world")
@dataclass
class WorldStage(Stage):
    """The tiny world and its index (reused by :func:`~mopd.recipes.tiny_world.world.build_world` itself)."""

    seed: int = 0
    settings: Tuple[str, ...] = ()

    @staticmethod
    def world_settings(items: Sequence[str], seed: int = 0):
        own, rest = _split(items, ("quick",))
        options = WorldOptions(**parse_key_values(own, WorldOptions, what="world"))
        return parse_world_settings(rest, seed=seed, quick=options.quick)

    @classmethod
    def check_settings(cls, items: List[str]) -> None:
        cls.world_settings(items)

    @classmethod
    def build(cls, cfg, key: str, items: List[str]) -> "WorldStage":
        kind = cls.world_settings(items, cfg.seed).index_kind
        return cls(key, key, f"the tiny world and its {kind} index", outputs=[str(Path(cfg.root) / "world")],
                   seed=cfg.seed,
                   settings=tuple(items))

    def done(self) -> bool:
        return (Path(self.outputs[0]) / "world.json").is_file()

    def command(self, cfg):
        return ["(in-process)", "mopd.recipes.tiny_world.world.build_world", self.outputs[0]]

    def disk(self) -> str:
        return "the tiny world's files"

    def run(self, ctx) -> None:
        s = self.world_settings(self.settings, self.seed)
        ctx.log(f"world + {s.index_kind} index -> {self.outputs[0]}")
        world.build_world(Path(self.outputs[0]), settings=s)   # through its module: tests watch it


@register_stage_kind("tiny_pi0")
@dataclass
class Pi0Stage(Stage):
    """pi_0's warm start on the tiny world (reused by :func:`~mopd.recipes.tiny_world.warmstart.build_pi0` itself)."""

    seed: int = 0
    settings: Tuple[str, ...] = ()

    @staticmethod
    def pi0_settings(items: Sequence[str]) -> dict:
        own, rest = _split(items, ("threads",))
        kw = parse_pi0_settings(rest)
        kw["threads"] = Pi0Options(**parse_key_values(own, Pi0Options, what="pi_0")).threads
        return kw

    @classmethod
    def check_settings(cls, items: List[str]) -> None:
        cls.pi0_settings(items)

    @classmethod
    def build(cls, cfg, key: str, items: List[str]) -> "Pi0Stage":
        return cls(key, key, "pi_0: SFT warm start on scripted demonstrations",
                   inputs=[str(Path(cfg.root) / "world")], outputs=[str(Path(cfg.model))], seed=cfg.seed,
                   settings=tuple(items))

    def done(self) -> bool:
        return (Path(self.outputs[0]) / "pi0.json").is_file()

    def command(self, cfg):
        return ["(in-process)", "mopd.recipes.tiny_world.warmstart.build_pi0", self.inputs[0], self.outputs[0],
                *self.settings]

    def disk(self) -> str:
        return "the tiny model and its demonstrations"

    def seconds_built(self):
        return (read_pi0(self.outputs[0]) or {}).get("seconds", {}).get("total", 0.0)

    def run(self, ctx) -> None:
        ctx.log(f"pi_0 warm start (SFT on scripted demonstrations) -> {self.outputs[0]}")
        kw = self.pi0_settings(self.settings)
        kw["demo_workers"] = ctx.cfg.launcher.eval_workers
        deterministic_torch(1)
        build_pi0(Path(self.inputs[0]), Path(self.outputs[0]), seed=self.seed, **kw)


@dataclass(frozen=True)
class CheckSettings:
    attempts: int = 4
    """Workflows per dev question (format validity and EM, both workflows)."""
    weak_em: float = 0.15
    """pi_0 is flagged weak below this dev EM (mean of C-MAS and H-MAS)."""
    weak_valid: float = 0.9
    """pi_0 is flagged weak when fewer of its Answerer outputs than this are valid."""

    def __post_init__(self):
        if self.attempts < 1:
            raise ValueError(f"attempts={self.attempts} must be > 0 (no check: leave the stage out)")
        WeakPi0(em=self.weak_em, valid=self.weak_valid)


@register_stage_kind("tiny_pi0_check")
@dataclass
class Pi0CheckStage(Stage):
    """pi_0's dev check (reused by :func:`~mopd.recipes.tiny_world.policy_check.check_pi0_cached` itself)."""

    seed: int = 0
    settings: Tuple[str, ...] = ()

    @staticmethod
    def check_settings_of(items: Sequence[str]) -> CheckSettings:
        return CheckSettings(**parse_key_values(items, CheckSettings, what="pi_0 check"))

    @classmethod
    def check_settings(cls, items: List[str]) -> None:
        cls.check_settings_of(items)

    @classmethod
    def build(cls, cfg, key: str, items: List[str]) -> "Pi0CheckStage":
        return cls(key, key, "pi_0's format validity and EM on dev", inputs=[str(Path(cfg.model))],
                   outputs=[str(Path(cfg.root) / "pi0_check.json")], seed=cfg.seed, settings=tuple(items))

    def done(self) -> bool:
        return Path(self.outputs[0]).is_file()

    def command(self, cfg):
        return ["(in-process)", "mopd.recipes.tiny_world.policy_check.check_pi0_cached", self.inputs[0],
                f"attempts={self.check_settings_of(self.settings).attempts}"]

    def report_inputs(self) -> List[str]:
        return [self.outputs[0]]

    def disk(self) -> str:
        return "the check's table"

    def run(self, ctx) -> dict:
        s = self.check_settings_of(self.settings)
        return check_pi0_cached(self.inputs[0], Path(ctx.root) / "world", Path(self.outputs[0]), attempts=s.attempts,
                                seed=self.seed, weak=WeakPi0(em=s.weak_em, valid=s.weak_valid), log=ctx.log,
                                workers=ctx.cfg.launcher.eval_workers)


@register_report_kind("claims")
def claims_report(stage, setup_results: Dict[str, object], log) -> Path:
    """`mopd eval report`'s report with the demo's claims at its top and pi_0's check at its end."""
    logs = [Path(p) for p in stage.logs]
    inputs = ReportInputs(logs=logs, labels=stage.labels, draws=stage.draws, dev=stage.dev,
                          pi0_check=setup_results.get(PI0_CHECK),
                          training=training_note([p.parent for p in logs], stage.labels),
                          teacher_check=report_sections(stage.sections))
    return write_report([e.out for e in stage.evals], stage.names, stage.out, inputs)
