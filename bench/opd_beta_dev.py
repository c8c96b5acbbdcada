"""OPD beta on a finished demo run's dev split: train one more MultiAgent-OPD arm with another
Searcher OPD weight (beta), from the run's own pi_0 and Stage-I teacher, with the same seed,
questions, steps and last-step export as its MultiAgent-OPD arm, evaluate it on dev and print its
paired difference against that arm's dev evaluation, with the Searchers' teacher log-ratio over
training and the no-search fraction. Reads nothing of the test split. Usage (bench/RESULTS.md,
"OPD beta 0.01 against beta 1 with the current pi_0"):

    PYTHONPATH=. python bench/opd_beta_dev.py runs/demo --beta 0.01

The run needs its dev evaluation (``mopd demo --eval-split dev``, eval_dev/multiagent_opd).
The extra arm lands in RUN/tuning_opd_beta_<beta>/ and its evaluation in
RUN/eval_dev/multiagent_opd_beta_<beta>/; a second call reuses both.
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from mopd.config import RetrieverConfig
from mopd.demo import Arm, DemoSettings, _arm_config, _eval_questions, _evaluate, _train_arms, world_settings
from mopd.data.tinyworld import build_world
from mopd.eval.report import load_runs
from mopd.eval.summary import summarize
from mopd.retriever import load_retriever
from mopd.retriever.memo import QueryMemo


def teacher_log_ratio(metrics: Path) -> list:
    """(step, Searcher teacher log-ratio) of a run's training log, where logged."""
    out = []
    for line in metrics.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        v = row.get("loss/searcher_opd_log_ratio")   # the Searchers' mean log pi_teacher - log pi
        if v is not None:
            out.append((row.get("step"), round(float(v), 4)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a finished demo run directory (runs/demo)")
    ap.add_argument("--beta", type=float, required=True, help="the Searcher's OPD weight of the extra arm")
    ap.add_argument("--draws", type=int, default=4000)
    a = ap.parse_args()
    reference = a.run / "eval_dev" / "multiagent_opd"
    if not reference.is_dir():
        print(f"{reference} not found: run `mopd demo --out {a.run} --eval-split dev` first", file=sys.stderr)
        return 2
    saved = json.loads((a.run / "demo_settings.json").read_text())
    s = DemoSettings(**{**saved, "eval_split": "dev", "arm_workers": 1})
    world = build_world(a.run / "world", settings=world_settings(s))   # reused: the run's own world
    retriever = QueryMemo(load_retriever(RetrieverConfig(kind="inprocess", index=str(world.index))))
    pi0, stage1 = str(a.run / "pi0"), str(a.run / "stage1" / "export")
    tag = f"{a.beta:g}"
    arm = Arm(f"MultiAgent-OPD beta {tag}", "tiny_mopd", f"tuning_opd_beta_{tag}", f"Stage II, OPD beta {tag}")
    cfg = _arm_config(arm, s, world, pi0, stage1, a.run)
    cfg.algo.roles["searcher"] = dataclasses.replace(cfg.algo.role("searcher"), opd_coef=a.beta)
    (export,) = _train_arms([arm], [cfg], s, world, retriever, a.run)
    out = a.run / "eval_dev" / f"multiagent_opd_beta_{tag}"
    _evaluate(arm.name, str(export), "hmas", _eval_questions(world, s), retriever, s, out)

    names = ["MultiAgent-OPD", arm.name]
    runs = load_runs([reference, out], names)
    summary = summarize(runs, reference="MultiAgent-OPD", draws=a.draws, seed=0)
    k = summary["metric_names"]["avg"]
    row = summary["accuracy"]["strict"][arm.name]["macro"][k]
    acts = summary["activity"]
    # summarize's differences are reference minus system: beta 1 minus the extra arm
    print(f"dev {k}: MultiAgent-OPD (beta 1) minus beta {tag}: {row['diff_vs_reference'] * 100:+.2f} points "
          f"[{row['diff_ci'][0] * 100:+.2f}, {row['diff_ci'][1] * 100:+.2f}]")
    for name, run_dir in zip(names, [a.run / "stage2", a.run / arm.dir]):
        print(f"{name}: {k} {summary['accuracy']['strict'][name]['macro'][k]['value']:.4f}, "
              f"no-search {acts[name]['macro']['no_search']:.4f}, searches {acts[name]['macro']['searches']:.2f}, "
              f"Searcher teacher log-ratio by step {teacher_log_ratio(run_dir / 'metrics.jsonl')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
