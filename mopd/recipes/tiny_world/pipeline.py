"""The demo's pipeline: the method end to end on the built-in tiny world, on a laptop CPU.

world -> retrieval index -> pi_0 (SFT warm start) -> its dev check -> Stage I (tiny_cmas_rl) ->
export as teacher -> Stage II arms from pi_0, side by side in processes of one thread (tiny_mopd and
its control tiny_no_searcher_supervision; with ablations also tiny_outcome_searcher and
tiny_base_teacher), each exported at its last step -> evaluation of C-MAS base, C-MAS + RL, H-MAS
base and every arm (4 attempts, question bootstrap) -> the report with its claims.

With ``lora`` (`mopd demo --lora`, the ``demo_lora`` preset) Stage I and every arm train LoRA
adapters over pi_0's frozen weights (:data:`LORA_OVERRIDES`); Stage I's adapter alone is the arms'
teacher (a view of their own base), and every evaluated model is the adapter merged into pi_0.

:class:`DemoSettings` are `mopd demo`'s options; :func:`demo_pipeline` turns them into the
:class:`~mopd.pipeline.config.PipelineConfig` that `mopd demo` runs (and that the ``demo``
pipeline preset is, at the defaults).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from mopd.config import RetrieverConfig
from mopd.pipeline.config import (DataPaths, EvalSettings, LauncherConfig, PipelineConfig, ReportSettings,
                                  SetupStageConfig, SystemConfig, TeacherCheckSettings, TrainStageConfig)
from mopd.pipeline.presets import pipeline_preset
from mopd.recipes.tiny_world.policy_check import WeakPi0
from mopd.recipes.tiny_world.warmstart import parse_pi0_settings
from mopd.recipes.tiny_world.world import parse_world_settings


@dataclass
class DemoSettings:
    out: str = "runs/demo"
    """Run directory; everything the demo builds lands here."""
    seed: int = 0
    """Seed of the world, pi_0 and training."""
    pi0_steps: Optional[int] = None
    """SFT steps of the warm start (None: the warm-start recipe's default)."""
    stage1_steps: int = 10
    """Stage I (C-MAS) training steps. The same as ``stage2_steps`` by default, and both stages
    train on 12 questions x 6 workflows per step (the tiny presets), so C-MAS + RL and every Stage II
    arm have the same RL budget (it was 15 steps of 16 x 8: docs/demo.md, "Why the tiny presets' values")."""
    stage2_steps: int = 10
    """Stage II (H-MAS) training steps, every arm alike. 10: on seed 0's dev split of the one-token
    pair world, with 10 steps the primary claim was +11.88 [+4.06, +19.69], with 8 (the first 8
    steps of the same runs) +3.44 [-4.06, +10.94]: MultiAgent-OPD's validation EM was 75.6% at steps
    5 and 10 and 69.4% at 8, the control's 70.0-71.2% (bench/RESULTS.md, "The demo on the one-token
    pair world"). Chosen on dev in the claim's favour; the test split was read after."""
    test_questions: Optional[int] = None
    """Evaluate on the first N test questions (None: the whole test split)."""
    attempts: int = 4
    """Independent workflows per test question."""
    bootstrap_draws: int = 4000
    """Question-bootstrap draws of the report."""
    with_ablations: bool = False
    """Also train the outcome-reward Searcher and base-teacher ablations (read at their last step, as
    the paper's Table 3) and report search activity over training."""
    index_kind: str = "flat"
    """flat (MiniLM embeddings, FAISS) or bm25."""
    overrides: List[str] = field(default_factory=list)
    """Extra config overrides applied to every training stage (e.g. trainer.lr=5e-4)."""
    quick: bool = False
    """A smoke run of the pipeline (a smaller world, a few SFT and RL steps, short workflows): checks
    that every stage and artifact works, says nothing about the method."""
    world: List[str] = field(default_factory=list)
    """World settings as KEY=VALUE (any :class:`mopd.recipes.tiny_world.world.WorldSettings` field, e.g.
    test_per_dataset=100 bands=400): a larger test split narrows the intervals at little cost."""
    pi0: List[str] = field(default_factory=list)
    """Warm-start settings as KEY=VALUE (any :class:`mopd.recipes.tiny_world.warmstart.WarmStartSettings` field but
    seed, e.g. search_first=0.9 steps=600)."""
    stage2_questions_per_step: Optional[int] = None
    """Stage II questions per step (None: the tiny_mopd preset's)."""
    eval_split: str = "test"
    """The split the systems are evaluated on: test (the final numbers, looked at once) or dev
    (every tuning choice; reported under report_dev/, evaluations under eval_dev/)."""
    pi0_check_attempts: int = 4
    """Workflows per dev question when pi_0 is checked (format validity and EM, both workflows)."""
    weak_pi0_em: float = 0.15
    """pi_0 is flagged weak when its dev EM (mean of C-MAS and H-MAS) is below this
    (:class:`mopd.recipes.tiny_world.policy_check.WeakPi0`)."""
    weak_pi0_valid: float = 0.9
    """pi_0 is flagged weak when fewer of its Answerer outputs than this are valid."""
    eval_workers: int = 2
    """Processes for the final evaluations (every system, two at a time with 2, on a machine with
    at least 2 cores). Each evaluation is a function of its model, questions and seed, so the records
    are the same with 1 (tested); 2 halves the evaluation's wall time on a 2-core machine."""
    threads: int = 2
    """Intra-op threads of the stages that run alone (pi_0's SFT, Stage I); the Stage II arms and
    the evaluations run one thread each, side by side. A fixed number, not the machine's core count:
    results depend on it in the last bits (2 threads trained the tiny model 1.7x faster than 1 on
    the 2-core box, bench/RESULTS.md), so a run is reproducible on any machine."""
    arm_workers: int = 2
    """Stage II arms trained at once (processes, one thread each): MultiAgent-OPD and its
    no-Searcher-supervision control, and with ablations the outcome-reward Searcher and the base
    teacher. Each arm is a function of its config and seed, so its weights are the same with 1."""
    lora: bool = False
    """Train Stage I and every Stage II arm as LoRA adapters over pi_0's frozen weights
    (:data:`LORA_OVERRIDES`: rank, alpha, learning rate) instead of all weights; Stage I's adapter is
    the arms' teacher. pi_0, the world and the evaluation are the full demo's."""
    lockstep: bool = True
    """Roll out (training and evaluation) with the lock-step scheduler, whose engine batches are a
    function of the runs' states, instead of the asynchronous one, whose batches depend on timing:
    a call's sampling log-probs change in the last bits with what it is batched with (measured up to
    1e-6 on the HF engine), so only lock-step runs are bit-reproducible."""

    def __post_init__(self):

        parse_pi0_settings(self.pi0)  # a bad KEY=VALUE fails here, before anything is built
        if self.eval_split not in ("test", "dev"):
            raise ValueError(f"eval_split={self.eval_split!r}: choose test or dev")
        if self.pi0_check_attempts < 0:
            raise ValueError("pi0_check_attempts must be >= 0 (0: no check)")
        if self.eval_workers < 1:
            raise ValueError("eval_workers must be >= 1")
        if self.arm_workers < 1:
            raise ValueError("arm_workers must be >= 1")
        if self.threads < 1:
            raise ValueError("threads must be >= 1")
        if self.stage2_questions_per_step is not None and self.stage2_questions_per_step < 1:
            raise ValueError("stage2_questions_per_step must be >= 1")
        world_settings(self)  # a bad KEY=VALUE fails here, before anything is built
        self.weak_pi0()       # and so does a threshold out of [0, 1]

    def weak_pi0(self):
        """The weak-pi_0 thresholds as one value (:class:`mopd.recipes.tiny_world.policy_check.WeakPi0`)."""

        return WeakPi0(em=self.weak_pi0_em, valid=self.weak_pi0_valid)


PI0_CHECK = "pi0_check"
"""The key of pi_0's check among the demo pipeline's setup stages: the claims report
(:func:`mopd.recipes.tiny_world.stages.claims_report`) shows what it returned."""

QUICK_WORKFLOW = {"max_output_tokens": 24, "max_steps": 3, "max_rounds": 1}
"""Workflow limits of a quick run (training and evaluation)."""
QUICK_OVERRIDES = ["trainer.questions_per_step=2", "rollout.group_size=2", "rollout.answer_candidates=2",
                   "trainer.val_every=1", "trainer.val_attempts=1", "data.dev_size=2"] + [f"rollout.{k}={v}" for k, v in QUICK_WORKFLOW.items()]
"""Overrides of every training stage of a quick run (the evaluation takes its workflow limits)."""
LORA_OVERRIDES = ["model.lora.rank=16", "model.lora.alpha=32", "trainer.lr=5e-3"]
"""What `mopd demo --lora` adds to every training stage (after a quick run's, before ``overrides``):
rank-16 adapters on every attention and MLP projection of pi_0's two layers (81,920 trainable
parameters beside its 661,120; the embeddings, norms and tied lm head stay frozen), alpha 32 (the update
scaled by 2), and 10x the full demo's lr 5e-4, the usual LoRA step-up (why these values:
docs/demo.md, "The LoRA variant")."""


def quick_settings(s: DemoSettings) -> DemoSettings:
    """``s`` shortened as `mopd demo --quick` shortens it: 2 steps per stage, 4 test questions, at
    most 2 attempts, 200 bootstrap draws, at most one workflow per question in the pi_0 check."""
    s.quick = True
    s.stage1_steps, s.stage2_steps = 2, 2
    s.test_questions = s.test_questions or 4
    s.attempts = min(s.attempts, 2)
    s.bootstrap_draws = 200
    s.pi0_check_attempts = min(s.pi0_check_attempts, 1)
    return s


def world_settings(s: DemoSettings):
    """The :class:`mopd.recipes.tiny_world.world.WorldSettings` of a demo: the default (or quick) world with
    the demo's seed and index kind, then ``s.world``'s KEY=VALUE entries."""

    return parse_world_settings(s.world, seed=s.seed, index_kind=s.index_kind, quick=s.quick)


@dataclass(frozen=True)
class Arm:
    """One Stage II run of the comparison: a system of the report, trained from pi_0."""

    name: str
    """The system's name in the report."""
    preset: str
    """Its tiny preset."""
    dir: str
    """Its run directory under the demo's."""
    label: str
    """Its validation curve's label."""

    @property
    def key(self) -> str:
        """Its key among the pipeline's Stage II arms (the method: mopd, no_searcher_supervision, ...)."""
        return self.preset.removeprefix("tiny_")


STAGE2_ARMS = [Arm("MultiAgent-OPD", "tiny_mopd", "stage2", "Stage II (MultiAgent-OPD)"),
               Arm("No Searcher supervision", "tiny_no_searcher_supervision", "stage2_no_searcher_supervision",
                   "Stage II, no Searcher supervision")]
"""The primary comparison: the same Stage II (pi_0, teacher, KL reference, seed, questions, steps,
checkpoint rule) with and without the Searcher's OPD loss."""
ABLATION_ARMS = [Arm("Outcome Searcher", "tiny_outcome_searcher", "ablation_outcome_searcher",
                     "Ablation (outcome Searcher)"),
                 Arm("Base teacher", "tiny_base_teacher", "ablation_base_teacher", "Ablation (base teacher)")]
"""``--with-ablations``: Table 3's other rows."""


def setup_stages(s: DemoSettings, pi0: List[str]) -> Dict[str, SetupStageConfig]:
    """The world, pi_0 and (unless ``s.pi0_check_attempts`` is 0) pi_0's check, as the pipeline's
    setup stages (:mod:`mopd.recipes.tiny_world.stages`)."""
    world = [f"index_kind={s.index_kind}", f"quick={str(s.quick).lower()}", *s.world]
    out = {"world": SetupStageConfig("tiny_world", world),
           "pi0": SetupStageConfig("tiny_pi0", [*pi0, f"threads={s.threads}"])}
    attempts = min(s.pi0_check_attempts, 1) if s.quick else s.pi0_check_attempts
    if attempts:
        out[PI0_CHECK] = SetupStageConfig("tiny_pi0_check", [f"attempts={attempts}", f"weak_em={s.weak_pi0_em}",
                                                               f"weak_valid={s.weak_pi0_valid}"])
    return out


def demo_pipeline(s: DemoSettings) -> PipelineConfig:
    """The pipeline `mopd demo` runs with settings ``s`` (paths under ``${root}``, = ``s.out``).

    Every training stage: the world's splits and index, pi_0, the demo's seed; a quick run's
    overrides first, then the stage's own (Stage I: ``s.threads`` threads; the arms:
    ``s.stage2_questions_per_step``), then ``s.overrides``."""
    quick = list(QUICK_OVERRIDES) if s.quick else []
    lora = list(LORA_OVERRIDES) if s.lora else []
    arms = STAGE2_ARMS + (ABLATION_ARMS if s.with_ablations else [])
    per_step = ([f"trainer.questions_per_step={s.stage2_questions_per_step}"]
                if s.stage2_questions_per_step is not None else [])
    pi0 = list(s.pi0) + ([f"steps={s.pi0_steps}"] if s.pi0_steps is not None else [])
    if s.quick:
        pi0 += [f"steps={s.pi0_steps or 3}", "max_questions=8", "attempts=1", "episodes_per_step=4"]
    dev = s.eval_split == "dev"
    q = "${root}/world/questions"
    return PipelineConfig(
        name="demo_lora" if s.lora else "demo",
        description="The method end to end on the built-in tiny world (CPU): world, pi_0, Stage I, Stage II "
                    "arms side by side, the evaluation of every system and the report with its claims"
                    + (", every training stage as LoRA adapters over pi_0 (its adapter the arms' teacher)."
                       if s.lora else "."),
        root=s.out, model="${root}/pi0", seed=s.seed,
        data=DataPaths(train=f"{q}/train.jsonl", dev=f"{q}/dev.jsonl", test=f"{q}/test.jsonl"),
        retriever=RetrieverConfig(kind="inprocess", index="${root}/world/index"),
        setup=setup_stages(s, pi0),
        overrides=list(s.overrides),
        stage1=TrainStageConfig(name="C-MAS + RL", preset="tiny_cmas_rl", dir="stage1", steps=s.stage1_steps,
                                overrides=quick + lora + [f"trainer.cpu_threads={s.threads}"], export="best",
                                label="Stage I (C-MAS + RL)"),
        stage2={a.key: TrainStageConfig(name=a.name, preset=a.preset, dir=a.dir, steps=s.stage2_steps,
                                        overrides=quick + lora + per_step, export="last", label=a.label)
                for a in arms},
        systems=[SystemConfig("C-MAS base", "base", "cmas"), SystemConfig("C-MAS + RL", "stage1", "cmas"),
                 SystemConfig("H-MAS base", "base", "hmas")] + [SystemConfig(a.name, a.key, "hmas") for a in arms],
        eval=EvalSettings(split=s.eval_split, attempts=s.attempts, questions=s.test_questions,
                          dir="eval_dev" if dev else "eval"),
        teacher_check=TeacherCheckSettings(questions=s.test_questions if s.quick else None),
        report=ReportSettings(kind="claims", dir="report_dev" if dev else "report", reference="MultiAgent-OPD",
                              draws=s.bootstrap_draws),
        launcher=LauncherConfig(kind="inprocess", arm_workers=s.arm_workers, eval_workers=s.eval_workers,
                                lockstep=s.lockstep),
    )


def _demo(**settings) -> PipelineConfig:
    s = DemoSettings(**{k: v for k, v in settings.items() if k != "quick"})
    return demo_pipeline(quick_settings(s) if settings.get("quick") else s)


@pipeline_preset
def demo() -> PipelineConfig:
    """`mopd demo` at its defaults: the built-in tiny world on a CPU, in this process (~25 minutes)."""
    return _demo()


@pipeline_preset
def demo_quick() -> PipelineConfig:
    """`mopd demo --quick`: the tiny pipeline shortened (quick world, 2 steps per stage, 4 test
    questions): checks that every stage works, says nothing about the method (about 35 s on an idle
    2-core CPU)."""
    cfg = _demo(quick=True, out="runs/demo_quick")
    cfg.name = "demo_quick"
    return cfg


@pipeline_preset
def demo_lora() -> PipelineConfig:
    """`mopd demo --lora`: the demo with Stage I and both Stage II arms trained as LoRA adapters over
    pi_0 (rank 16, alpha 32, lr 5e-3), Stage I's adapter the arms' teacher; world, pi_0 and
    evaluation as the full demo's."""
    return _demo(lora=True, out="runs/demo_lora")


@pipeline_preset
def demo_lora_quick() -> PipelineConfig:
    """`mopd demo --lora --quick`: the LoRA demo shortened as demo_quick (checks that every stage
    works, says nothing about the method)."""
    cfg = _demo(quick=True, lora=True, out="runs/demo_lora_quick")
    cfg.name = "demo_lora_quick"
    return cfg
