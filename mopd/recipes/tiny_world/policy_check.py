"""A quick health check of a policy on the tiny world: format validity and strict EM per workflow.

Used to size pi_0 (valid in format, EM well between 0 and 1) and by ``mopd world pi0 --check``.
It runs the real HF engine and ``run_workflows``; the full evaluation with bootstrap intervals
and plots is ``mopd.eval``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, Sequence
from mopd.config import EvalConfig, RetrieverConfig
from mopd.core.actions import parse_answerer
from mopd.core.reproducible import deterministic_torch
from mopd.core.roles import role_of_prompt
from mopd.core.scoring import exact_match
from mopd.core.spawn_map import spawn_map
from mopd.recipes.tiny_world.world import WorldPaths, load_split
from mopd.recipes.tiny_world.world import build_world, parse_world_settings
from pathlib import Path
import json
import os


@dataclass(frozen=True)
class WeakPi0:
    """When a warm start is too weak for the demo's RL to have something to reinforce."""

    em: float = 0.15
    """pi_0 is weak when its dev EM (mean over the workflows) is below this: the copying transition of
    the warm start has not happened (dev EM 0.02-0.10 before it in the runs measured, well above 0.15
    after it; bench/RESULTS.md)."""
    valid: float = 0.9
    """pi_0 is weak when any workflow's Answerer outputs are valid less often than this (measured:
    0.99-1.0)."""

    def __post_init__(self):
        for name in ("em", "valid"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"weak-pi_0 threshold {name}={getattr(self, name)}: choose it in [0, 1]")


def summarize(records) -> Dict[str, object]:
    """Answer validity (Answerer outputs with a valid ``<answer>`` action), invalid calls, strict
    EM overall and per dataset, searches and tokens per workflow."""

    answers = [c for r in records for c in r.calls_of("answerer")]
    calls = [c for r in records for c in r.calls]
    by_ds = defaultdict(list)
    for r in records:
        by_ds[r.dataset].append(exact_match(r.final_answer, r.answers))
    n = max(1, len(records))
    return {
        "workflows": len(records),
        "answer_valid": sum(parse_answerer(c.outputs()[-1] if c.outputs() else "").valid for c in answers)
        / max(1, len(answers)),
        "invalid_calls": sum(c.invalid for c in calls) / max(1, len(calls)),
        "invalid_by_role": {role: sum(c.invalid for c in calls if c.role == role)
                            / max(1, sum(1 for c in calls if c.role == role))
                            for role in ("leader", "searcher", "answerer") if any(c.role == role for c in calls)},
        "em": sum(v for vs in by_ds.values() for v in vs) / n,
        "em_by_dataset": {k: sum(v) / len(v) for k, v in sorted(by_ds.items())},
        "searches": sum(r.search_actions for r in records) / n,
        "tokens": sum(r.input_tokens + r.output_tokens for r in records) / n,
    }


def check_policy(model_dir, world_dir, *, split: str = "test", workflows: Sequence[str] = ("cmas", "hmas"),
                 temperature: float = 0.6, seed: int = 0, attempts: int = 1,
                 progress: bool = False) -> Dict[str, dict]:
    """``{workflow: summarize(records)}`` for ``model_dir`` on a split of the world, sampled at
    ``temperature`` with the evaluation protocol's top-p (``EvalConfig.top_p``)."""
    from mopd.recipes.tiny_world.warmstart import CachedRetriever, workflow_settings
    from mopd.retriever import load_retriever
    from mopd.rollout.hf_engine import HFEngine
    from mopd.rollout.scheduler import run_workflows

    paths = WorldPaths.of(world_dir)
    engine = HFEngine.from_pretrained(str(model_dir), device="cpu")
    retriever = CachedRetriever(load_retriever(RetrieverConfig(kind="inprocess", index=str(paths.index))))
    questions = load_split(paths, split)
    out = {}
    for wf in workflows:
        settings = workflow_settings(wf, temperature=EvalConfig.temperature, top_p=EvalConfig.top_p, seed=seed)
        records = run_workflows(engine, retriever, engine.tokenizer, questions, settings, attempts=attempts,
                                method="pi0-check", progress=progress)
        out[wf] = summarize(records)
    return out


def _check_one_workflow(model_dir, world_dir, split: str, workflow: str, temperature: float, seed: int,
                        attempts: int) -> dict:

    deterministic_torch(1)
    return check_policy(model_dir, world_dir, split=split, workflows=(workflow,), temperature=temperature, seed=seed,
                        attempts=attempts)[workflow]


def check_policy_side_by_side(model_dir, world_dir, *, workers: int, split: str = "test",
                              workflows: Sequence[str] = ("cmas", "hmas"), temperature: float = 0.6, seed: int = 0,
                              attempts: int = 1) -> Dict[str, dict]:
    """:func:`check_policy`, each workflow in its own spawned process of one thread, ``workers`` at
    a time. The records are those of one process at one thread: every request samples from its
    own seeded generator and every query is searched alone, so nothing carries from one workflow
    to the next."""


    workers = min(workers, len(workflows), os.cpu_count() or 1)
    if workers <= 1:

        deterministic_torch(1)
        return check_policy(model_dir, world_dir, split=split, workflows=workflows, temperature=temperature,
                            seed=seed, attempts=attempts)
    results = spawn_map(_check_one_workflow, [(str(model_dir), str(world_dir), split, wf, temperature, seed, attempts)
                                              for wf in workflows], workers)
    return dict(zip(workflows, results, strict=True))


def assess_pi0(result: Dict[str, dict], weak: WeakPi0 = WeakPi0()) -> Dict[str, object]:
    """Is a warm start strong enough for RL to have something to reinforce? ``result`` is
    :func:`check_policy`'s. pi_0 is weak when its EM (mean over the workflows) is below ``weak.em``
    or any workflow's Answerer outputs are valid less often than ``weak.valid``: with few correct
    rollouts per group, outcome RL and the Stage-I teacher have almost no signal."""
    if not result:
        raise ValueError("no workflow was checked")
    em = sum(r["em"] for r in result.values()) / len(result)
    valid = min(r["answer_valid"] for r in result.values())
    reasons = []
    if em < weak.em:
        reasons.append(f"dev EM {em:.3f} < {weak.em}")
    if valid < weak.valid:
        reasons.append(f"Answerer outputs valid {valid:.3f} < {weak.valid}")
    per = ", ".join(f"{wf} EM {r['em']:.3f}" for wf, r in result.items())
    if reasons:
        verdict = (f"pi_0 is WEAK ({'; '.join(reasons)}; {per}): with so few correct rollouts neither stage is "
                   "likely to learn in the demo's steps, so the claims of this run say little about the method.")
    else:
        verdict = f"pi_0 is usable (dev EM {em:.3f} >= {weak.em}, Answerer outputs valid {valid:.3f}; {per})."
    return {"em": em, "valid": valid, "weak": bool(reasons), "reasons": reasons, "verdict": verdict,
            "thresholds": {"em": weak.em, "valid": weak.valid}}


def check_pi0_cached(pi0, world_dir, path, *, attempts: int, seed: int, weak: WeakPi0 = WeakPi0(),
                     log=None, workers: int = 1) -> dict:
    """:func:`check_policy` of pi_0 on the dev split (both workflows, ``attempts`` per question, T=0.6)
    with :func:`assess_pi0`'s verdict, written to ``path`` and reused from it when it was measured on
    the same pi_0 with the same settings. ``workers`` > 1 checks the workflows side by side (the same
    records, :func:`check_policy_side_by_side`)."""

    from mopd.recipes.tiny_world.warmstart import read_pi0

    path = Path(path)
    key = {"pi0": read_pi0(pi0)["settings"], "attempts": attempts, "seed": seed, "weak_em": weak.em,
           "weak_valid": weak.valid}
    if path.is_file():
        done = json.loads(path.read_text())
        if done.get("key") == key:
            return done
    if log:
        log(f"pi_0 check: dev split, {attempts} workflows per question, C-MAS and H-MAS")
    result = check_policy_side_by_side(pi0, world_dir, workers=workers, split="dev", temperature=0.6, seed=seed,
                                       attempts=attempts)
    out = {"key": key, "split": "dev", "attempts": attempts, "workflows": result,
           **assess_pi0(result, weak)}
    if log:
        log(out["verdict"])
    path.write_text(json.dumps(out, indent=2))
    return out


def check_seeds(root, seeds: Sequence[int], *, world_items: Sequence[str] = (), pi0_items: Sequence[str] = (),
                attempts: int = 4, weak: WeakPi0 = WeakPi0(), log=None, workers: int = 2) -> Dict[int, dict]:
    """For each seed, the world and pi_0 as ``mopd demo --seeds`` builds them (ROOT/seedN/world,
    ROOT/seedN/pi0: the demo reuses them) and their dev check (ROOT/seedN/pi0_check.json);
    writes ROOT/pi0_check.json with every seed's verdict. ``world_items`` are the world's
    KEY=VALUE settings (``index_kind=bm25`` among them), ``pi0_items`` the warm start's
    (:func:`mopd.recipes.tiny_world.warmstart.parse_pi0_settings`; a later KEY wins, so
    ``steps=N`` appended sets the SFT steps); ``workers``: processes of the demonstrations and of
    the dev check."""

    from mopd.recipes.tiny_world.warmstart import build_pi0, parse_pi0_settings

    root = Path(root)
    out: Dict[int, dict] = {}
    for n in seeds:
        d = root / f"seed{n}"
        if log:
            log(f"seed {n}: world and pi_0 in {d}")
        world = build_world(d / "world", settings=parse_world_settings(world_items, seed=n))
        deterministic_torch(1)
        kw = parse_pi0_settings(pi0_items)
        pi0 = build_pi0(world.root, d / "pi0", seed=n, threads=1, demo_workers=workers, **kw)
        out[n] = check_pi0_cached(pi0, world.root, d / "pi0_check.json", attempts=attempts, seed=n,
                                  weak=weak, log=log, workers=workers)
    root.mkdir(parents=True, exist_ok=True)
    summary = {str(n): {k: r[k] for k in ("em", "valid", "weak", "reasons", "thresholds")}
               | {"workflows": {wf: {"em": w["em"], "answer_valid": w["answer_valid"],
                                     "invalid_calls": w["invalid_calls"]} for wf, w in r["workflows"].items()}}
               for n, r in out.items()}
    (root / "pi0_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out


class AnswererOnly:
    """An engine that sends the Answerer's requests to ``model`` and every other role's to
    ``team`` (the Engine protocol's ``generate``; nothing else is needed by ``run_workflows``).
    With the scripted team as ``team`` it measures the model's Answerer alone: given the reports a
    scripted Leader and scripted Searchers bring back, does it write the answer they support?"""

    def __init__(self, team, model, tokenizer):
        self.team, self.model, self.tokenizer = team, model, tokenizer
        self._fast = getattr(tokenizer, "backend_tokenizer", None)

    def _role(self, ids) -> str:

        text = (self._fast.decode(list(ids), skip_special_tokens=False) if self._fast is not None
                else self.tokenizer.decode(ids, skip_special_tokens=False))
        return role_of_prompt(text) or ""

    def generate(self, requests):
        to_model = [i for i, r in enumerate(requests) if self._role(r.prompt_ids) == "answerer"]
        chosen = set(to_model)
        rest = [i for i in range(len(requests)) if i not in chosen]
        out = [None] * len(requests)
        for engine, idx in ((self.model, to_model), (self.team, rest)):
            if idx:
                for i, completions in zip(idx, engine.generate([requests[i] for i in idx]), strict=True):
                    out[i] = completions
        return out

    def reset_prefix_cache(self) -> None:
        for engine in (self.team, self.model):
            getattr(engine, "reset_prefix_cache", lambda: None)()


def check_answerer(model_dir, world_dir, *, split: str = "dev", workflows: Sequence[str] = ("cmas", "hmas"),
                   seed: int = 0, attempts: int = 4, style=None, progress: bool = False) -> Dict[str, dict]:
    """``{workflow: summarize(records)}``, sampling as the evaluation does (``EvalConfig``'s
    temperature and top_p), of the scripted team (:mod:`mopd.recipes.tiny_world.scripted_policy`,
    ``style`` or its defaults) with ``model_dir``'s Answerer, on a split of the world; also
    ``{workflow}_scripted``: the same workflows with the scripted Answerer, for comparison
    (same seeds, so the same Leader and Searcher draws up to the Answerer's turn). Each summary
    also has ``em_given_facts``: per dataset, the EM of the workflows whose last Answerer prompt
    holds every gold fact the answer needs (both bands' sentences for a pair question; the
    Answerer's own job, whatever the Searchers missed), and ``given_facts``: how many those were."""
    from mopd.recipes.tiny_world.scripted_policy import DemoEngine, DemoStyle, world_policy
    from mopd.recipes.tiny_world.warmstart import CachedRetriever, workflow_settings
    from mopd.retriever import load_retriever
    from mopd.rollout.hf_engine import HFEngine
    from mopd.rollout.scheduler import run_workflows

    paths = WorldPaths.of(world_dir)
    model = HFEngine.from_pretrained(str(model_dir), device="cpu")
    tok = model.tokenizer
    retriever = CachedRetriever(load_retriever(RetrieverConfig(kind="inprocess", index=str(paths.index))))
    questions = load_split(paths, split)
    policy = world_policy(paths.root, style or DemoStyle())
    out = {}
    for wf in workflows:
        settings = workflow_settings(wf, temperature=EvalConfig.temperature, top_p=EvalConfig.top_p, seed=seed)
        for name, engine in ((wf, AnswererOnly(DemoEngine(policy, tok, seed=seed), model, tok)),
                             (f"{wf}_scripted", DemoEngine(policy, tok, seed=seed))):
            records = run_workflows(engine, retriever, tok, questions, settings, attempts=attempts,
                                    method="answerer-check", progress=progress)
            out[name] = summarize(records) | _em_given_facts(records, policy, tok)
    return out


def _em_given_facts(records, policy, tokenizer) -> dict:
    """EM per dataset over the workflows whose last Answerer prompt holds every gold sentence the
    answer needs (:meth:`mopd.recipes.tiny_world.scripted_policy.DemoPolicy.holds_needed_facts`)."""

    by_ds = defaultdict(list)
    for r in records:
        calls = r.calls_of("answerer")
        if not calls:
            continue
        prompt = tokenizer.decode(calls[-1].token_ids(), skip_special_tokens=False)
        if policy.holds_needed_facts(r.question, prompt):
            by_ds[r.dataset].append(exact_match(r.final_answer, r.answers))
    return {"em_given_facts": {k: sum(v) / len(v) for k, v in sorted(by_ds.items())},
            "given_facts": {k: len(v) for k, v in sorted(by_ds.items())}}
