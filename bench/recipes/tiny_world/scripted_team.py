"""The scripted team (mopd.recipes.tiny_world.scripted_policy) through the real workflows, per dataset and workflow:
EM, searches and Leader subtasks per workflow, and how often the Leader delegates two or more
subtasks (in all, and in its first output). Usage (bench/RESULTS.md, "Pair questions"):

    PYTHONPATH=. python bench/recipes/tiny_world/scripted_team.py [--index bm25|flat] [--split train] [--attempts 2]
        [--search-first 0.9] [--both-facts 0.6] [--seed 0] [--world DIR]

With ``--answerer MODEL`` (a pi_0 directory; ``--world`` its world) it measures that model's
Answerer alone instead: the scripted Leader and Searchers run every workflow, the model writes the
answer at T=0.6 (the evaluation's sampling), beside the scripted Answerer on the same draws:

    PYTHONPATH=. python bench/recipes/tiny_world/scripted_team.py --world runs/demo/world --answerer runs/demo/pi0 --split dev --attempts 4
"""

import argparse
import collections
import tempfile

from mopd.core.scoring import exact_match
from mopd.recipes.tiny_world.scripted_policy import DemoEngine, DemoStyle, world_policy
from mopd.recipes.tiny_world.tiny_model import default_corpus, train_tokenizer
from mopd.recipes.tiny_world.world import WorldPaths, WorldSettings, build_world, load_split
from mopd.recipes.tiny_world.warmstart import CachedRetriever, tokenizer_texts, workflow_settings
from mopd.retriever import open_retriever
from mopd.rollout.scheduler import run_workflows


def answerer_table(a, style):
    from mopd.recipes.tiny_world.policy_check import check_answerer

    result = check_answerer(a.answerer, a.world, split=a.split, attempts=a.attempts, seed=a.seed, style=style)
    datasets = sorted(next(iter(result.values()))["em_by_dataset"])
    print("EM of every workflow, and (in brackets) of those whose Answerer was given every fact the answer "
          "needs, with their number")
    print("| workflow | Answerer | " + " | ".join(datasets) + " | all | answers valid |")
    print("|---|---|" + "---|" * (len(datasets) + 2))
    for name, r in result.items():
        wf, _, scripted = name.partition("_")
        cells = [f"{r['em_by_dataset'][d]:.3f} ({r['em_given_facts'].get(d, float('nan')):.3f}, "
                 f"n={r['given_facts'].get(d, 0)})" for d in datasets]
        print(f"| {wf} | {'scripted' if scripted else 'model'} | " + " | ".join(cells)
              + f" | {r['em']:.3f} | {r['answer_valid']:.3f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--index", default="bm25")
    ap.add_argument("--split", default="train")
    ap.add_argument("--attempts", type=int, default=2)
    ap.add_argument("--search-first", type=float, default=DemoStyle.search_first)
    ap.add_argument("--both-facts", type=float, default=DemoStyle.both_facts)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--world", default=None, help="an existing world directory (default: build seed 0's)")
    ap.add_argument("--answerer", default=None, help="a model directory whose Answerer to measure")
    a = ap.parse_args()
    style = DemoStyle(search_first=a.search_first, both_facts=a.both_facts)
    if a.answerer:
        if not a.world:
            ap.error("--answerer needs --world (the model's world)")
        answerer_table(a, style)
        return
    world = (WorldPaths.of(a.world) if a.world
             else build_world(tempfile.mkdtemp() + "/w", settings=WorldSettings(index_kind=a.index)))
    tok = train_tokenizer(default_corpus() + tokenizer_texts(world.root), vocab_size=2048)
    retriever = CachedRetriever(open_retriever(world.index))
    questions = load_split(world, a.split)
    print("| workflow | dataset | workflows | EM | searches | subtasks | >=2 subtasks | >=2 in first output |")
    print("|---|---|---|---|---|---|---|---|")
    for wf in ("cmas", "hmas"):
        engine = DemoEngine(world_policy(world.root, style), tok, seed=a.seed)
        settings = workflow_settings(wf, temperature=1.0, top_p=1.0, seed=a.seed)
        records = run_workflows(engine, retriever, tok, questions, settings, attempts=a.attempts, progress=False)
        rows = collections.defaultdict(list)
        for r in records:
            subtasks = r.events_of("subtask")
            first = sum(e.step == subtasks[0].step for e in subtasks) if subtasks else 0
            rows[r.dataset].append((exact_match(r.final_answer, r.answers), r.search_actions, len(subtasks), first))
        for ds, v in sorted(rows.items()):
            n = len(v)
            print(f"| {wf} | {ds} | {n} | {sum(x[0] for x in v) / n:.3f} | {sum(x[1] for x in v) / n:.2f} | "
                  f"{sum(x[2] for x in v) / n:.2f} | {sum(x[2] >= 2 for x in v) / n:.2f} | "
                  f"{sum(x[3] >= 2 for x in v) / n:.2f} |")


if __name__ == "__main__":
    main()
