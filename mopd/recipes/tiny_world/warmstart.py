"""pi_0 for the tiny world: a small Qwen3 model warm-started by supervised fine-tuning on scripted
demonstrations of all three roles, in both workflows.

The demo stands in for an instruction-tuned model, so pi_0 must already speak the action format
of every role (Searcher, Leader, Answerer; C-MAS and H-MAS) while leaving room for RL. Steps:

1. a byte-level BPE tokenizer trained on the world's passages and training questions, and a
   random Qwen3 model (:func:`mopd.recipes.tiny_world.tiny_model.init_tiny_model`);
2. demonstrations: the real ``run_workflows`` over the training questions with the scripted,
   deliberately imperfect :class:`mopd.recipes.tiny_world.scripted_policy.DemoEngine`, so every sequence is exactly
   what the model will see (token ids and loss masks of each agent call); optionally
   (``practice_worlds``, off by default) also over every question of a few other-seed worlds,
   where the same names mean other facts, so that only copying from the prompt fits them;
3. next-token cross-entropy on the model-written tokens (loss mask 1) only (:mod:`mopd.data.sft`),
   with the name tokens (towns, rivers, people, band words) weighted 5x: every useful action is a
   name copied from the prompt, and unweighted the model learned the sentence templates but wrote
   towns from memory (test EM 0.03-0.07 after 450 steps; 0.13-0.16 with the weight).

``out_dir`` gets the model and tokenizer (``from_pretrained``-ready) and ``pi0.json`` (settings,
loss curve, wall time, demo statistics). A finished directory with the same settings is reused.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from mopd.core.key_values import parse_key_values
from mopd.data.markers import read_marker
from mopd.data.sft import SFTSettings, train_sft
from mopd.retriever.memo import QueryMemo
from mopd.config import RetrieverConfig
from mopd.config import resolve
from mopd.core.reproducible import deterministic_torch
from mopd.core.scoring import exact_match
from mopd.core.spawn_map import spawn_map
from mopd.recipes.tiny_world.world import WorldPaths
from mopd.recipes.tiny_world.world import load_split
from mopd.recipes.tiny_world.world import WorldSettings, build_world
from mopd.recipes.tiny_world.world_kb import name_vocabulary
from mopd.retriever.corpus import corpus_fingerprint

PI0_FILE = "pi0.json"
PI0_FORMAT = 2
"""Part of a pi_0 directory's settings: 2 since the SFT packs each role's calls into one row and
steps a fused AdamW (the same loss, other float rounding), so a pi_0 trained before is rebuilt,
not reused as if this code had made it."""


@dataclass(frozen=True)
class WarmStartSettings:
    steps: int = 1200
    """SFT steps. The tiny model learns to copy names from its prompt in a sudden transition whose
    step depends on the seed: with ``search_first`` 0.9, at 450 steps pi_0's dev EM was 0.02-0.28 in
    8 runs (below 0.11 in 5), at 800 it was 0.70-0.87 on all 10 seeds; with 0.6, at 800 steps, it
    was 0.39-0.55 on all 10 seeds of the chain-only world (``mopd world pi0-check``; bench/RESULTS.md,
    "The demo's warm start" and "A warm start that under-searches"). Copying two names into a pair
    answer comes later: on seed 0 with one-token pair answers, 800 steps gave dev EM 0.277 and the
    Answerer wrote 0-30% of the scripted team's pair answers right, 1,200 steps (and 320 training
    questions per pair type) 0.347 and 46-51% (bench/RESULTS.md, "Pair questions with one-token
    answers")."""
    episodes_per_step: int = 16
    """Demonstration episodes (all their agent calls) per optimiser step."""
    attempts: int = 4
    """Demonstrations per training question and workflow."""
    max_questions: Optional[int] = None
    """Use only the first N training questions (quick runs and tests); None: all."""
    practice_worlds: int = 0
    """Other worlds (other seeds, BM25 index) whose every question is demonstrated once per
    workflow. The same names carry different facts in each, so the only way to fit them is to
    copy from the prompt (query from question, report from passages, answer from reports).
    Measured with test subjects never named in training: 6 practice worlds and 7,200 episodes
    taught copying of band names into queries but not of towns into reports (test EM 0.00-0.05),
    so they are off by default; kept for longer warm starts and bigger models."""
    workflows: Tuple[str, ...] = ("cmas", "hmas")
    lr: float = 3e-3
    warmup_frac: float = 0.05
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch_tokens: int = 4096
    """Tokens per forward/backward (a packed row's: :class:`mopd.data.sft.SFTSettings`; memory bound
    only: the step is the same either way)."""
    seed: int = 0
    vocab_size: int = 2048
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    ffn: int = 384
    name_weight: float = 5.0
    """Loss weight of target tokens that are names (towns, rivers, people, band words; the tokens
    the policy must copy from its prompt) relative to the other trained tokens."""
    good_query: float = 0.8
    right_copy: float = 0.9
    right_pick: float = 0.9
    search_first: float = 0.7
    """How often a demonstrated Searcher searches before its first report; otherwise it reports a
    made-up fact at once. pi_0 learns this as a habit it samples, so it sets the headroom outcome RL
    and OPD have: on seed 0's dev split of the chain-only world, 0.9 gave a pi_0 at dev EM 0.71 whose
    misses were sampling slips (pass@4 92-94%, RL could only sharpen), 0.6 one at 0.43 (about 1
    search per workflow), and at 0.4 the copying transition did not happen within 800 steps (EM
    0.03; bench/RESULTS.md, "A warm start that under-searches"). With the one-token pair questions
    (1,200 steps, seed 0 dev): 0.6 gave 0.347, 0.7 0.448 and 0.8 0.552; 0.7 keeps the demo's pi_0
    above the 0.35 dev EM the demo needs (the weak-pi_0 tuning in bench/RESULTS.md) with room for other seeds and leaves a no-search habit for the Searcher's
    training to remove (bench/RESULTS.md, "Pair questions with one-token answers")."""

    split_pair: float = 0.8
    """How often the demonstrated Leader splits a pair question into one subtask per band
    (:class:`mopd.recipes.tiny_world.scripted_policy.DemoStyle`)."""
    both_facts: float = 0.6
    """How often a demonstrated Searcher with two facts to find goes on to the second
    (:class:`mopd.recipes.tiny_world.scripted_policy.DemoStyle`)."""

    def __post_init__(self):
        if self.steps < 1 or self.episodes_per_step < 1 or self.attempts < 1:
            raise ValueError("steps, episodes_per_step and attempts must be >= 1")
        for name in ("good_query", "right_copy", "right_pick", "search_first", "split_pair", "both_facts"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} is a probability: choose it in [0, 1]")


def parse_pi0_settings(items: Sequence[str] = ()) -> Dict[str, object]:
    """``build_pi0`` keyword overrides from KEY=VALUE entries (any :class:`WarmStartSettings` field but
    seed and workflows, typed like its default; ``max_questions=none`` for all questions)."""
    out = parse_key_values(items, WarmStartSettings, what="pi_0", exclude=("seed", "workflows"))
    WarmStartSettings(**out)  # the recipe's own checks (ranges), before anything is built
    return out


@dataclass
class Demonstrations:
    """Training sequences grouped by episode: ``episodes[e]`` = [(token ids, loss mask), ...]."""

    episodes: List[List[Tuple[List[int], List[int]]]] = field(default_factory=list)
    stats: Dict[str, dict] = field(default_factory=dict)

    def extend(self, other: "Demonstrations", label: str) -> None:
        self.episodes.extend(other.episodes)
        for wf, st in other.stats.items():
            self.stats[f"{label}/{wf}"] = st


def practice_world_seeds(seed: int, n: int) -> List[int]:
    """Seeds of the practice worlds of pi_0 number ``seed`` (far from the small seeds users pick)."""
    return [100_000 + 1_000 * seed + k for k in range(n)]


def build_practice_worlds(base_dir, seed: int, n: int) -> list:
    """The practice worlds (BM25 indexes: a second each), built once under ``base_dir``."""

    return [build_world(Path(base_dir) / f"seed{ps}", settings=WorldSettings(seed=ps, index_kind="bm25"))
            for ps in practice_world_seeds(seed, n)]


class CachedRetriever(QueryMemo):
    """Memoises a retriever's results per (query, k): scripted demos repeat the same few query
    wordings many times, and a dense query costs an encoder pass. Each new query is searched
    alone, so its passages do not depend on the queries searched with it (bit-reproducible)."""


@functools.lru_cache(maxsize=None)
def workflow_settings(workflow: str, *, temperature: float, top_p: float, seed: int):
    """The workflow limits the demo trains and evaluates with: those of the tiny presets
    (``tiny_cmas_rl`` for C-MAS, ``tiny_mopd`` for H-MAS), so pi_0 learns the step budgets, round
    limits and forced endings it will meet in Stage I and Stage II; one Answerer candidate."""

    from mopd.rollout.run_state import WorkflowSettings

    cfg = resolve("tiny_cmas_rl" if workflow == "cmas" else "tiny_mopd")
    return dataclasses.replace(WorkflowSettings.for_training(cfg, seed), answer_candidates=1,
                               temperature=temperature, top_p=top_p)


PROMPT_WEIGHT = 30
"""Copies of the role prompts among the tokenizer's training texts. Once each, they are a sliver
of the text and split into pieces (the Searcher's system prompt took 190 tokens of a 1,024-token
BPE); weighted, every word is one token (108), and the world's passages lose little."""


NAME_WEIGHT = 4
"""Copies of the world's name vocabulary (:func:`mopd.recipes.tiny_world.world_kb.name_vocabulary`) among the
tokenizer's training texts: with a 2,048-token BPE every town, river and name word is one token."""


PAIR_ANSWER_TEXTS = ["<answer>Ashford and folk</answer>", " and "]
"""The joint of a pair answer ("Ashford and folk"), so " and" after a name is one token."""


def tokenizer_texts(world_dir) -> List[str]:
    """What the tokenizer is trained on: every passage, the training questions, the subtask
    wordings (pair subtasks and the pair answers' joint included), the role prompts ``PROMPT_WEIGHT``
    times and the name vocabulary ``NAME_WEIGHT`` times."""
    from mopd.recipes.tiny_world.scripted_policy import PAIR_SUBTASK_TEXTS, SUBTASK_RIVER, SUBTASK_TOWN, SUBTASK_TWO_HOP
    from mopd.rollout.prompts import all_prompt_texts

    paths = WorldPaths.of(world_dir)
    with paths.corpus.open(encoding="utf-8") as f:
        texts = [json.loads(line)["contents"] for line in f if line.strip()]
    texts += [q.question for q in load_split(paths, "train")]
    texts += list(SUBTASK_TOWN.values()) + list(SUBTASK_TWO_HOP.values()) + [SUBTASK_RIVER]
    texts += PAIR_SUBTASK_TEXTS + PAIR_ANSWER_TEXTS * NAME_WEIGHT
    chat_roles = "system\nuser\nassistant\n"  # the chat template's role headers
    names = name_vocabulary()
    name_lines = [" ".join(names[i:i + 20]) for i in range(0, len(names), 20)]
    return (texts + (list(all_prompt_texts()) + [chat_roles]) * PROMPT_WEIGHT
            + name_lines * NAME_WEIGHT)


def make_demonstrations(world_dir, tokenizer, retriever, *, workflows: Sequence[str] = ("cmas", "hmas"),
                        attempts: int = 4, seed: int = 0, style=None, questions=None) -> Demonstrations:
    """Scripted episodes over the training questions (or ``questions``), as training sequences."""
    from mopd.recipes.tiny_world.scripted_policy import DemoEngine, DemoStyle, world_policy
    from mopd.rollout.scheduler import run_workflows

    paths = WorldPaths.of(world_dir)
    qs = questions if questions is not None else load_split(paths, "train")
    engine = DemoEngine(world_policy(paths.root, style or DemoStyle()), tokenizer, seed=seed)
    demos = Demonstrations()
    for wf in workflows:
        settings = workflow_settings(wf, temperature=1.0, top_p=1.0, seed=seed)
        records = run_workflows(engine, retriever, tokenizer, qs, settings, attempts=attempts, method="demo",
                                progress=False)
        tokens, cut = 0, 0
        for r in records:
            cut += sum(f == "length" for c in r.calls for f in c.finish_reasons)
            calls = [(c.token_ids(), c.loss_mask()) for c in r.calls if c.segments]
            demos.episodes.append(calls)
            tokens += sum(len(ids) for ids, _ in calls)
        demos.stats[wf] = {
            "episodes": len(records),
            "em": sum(exact_match(r.final_answer, r.answers) for r in records) / max(1, len(records)),
            "searches_per_episode": sum(r.search_actions for r in records) / max(1, len(records)),
            "tokens_per_episode": tokens / max(1, len(records)),
            "outputs_cut_at_max_tokens": cut,
        }
    return demos


def _demonstrations_in_worker(world_dir, tokenizer_dir, workflow: str, attempts: int, seed: int, style,
                              max_questions) -> Demonstrations:
    from transformers import AutoTokenizer

    from mopd.retriever import load_retriever

    deterministic_torch(1)
    paths = WorldPaths.of(world_dir)
    retriever = CachedRetriever(load_retriever(RetrieverConfig(kind="inprocess", index=str(paths.index))))
    return make_demonstrations(paths.root, AutoTokenizer.from_pretrained(tokenizer_dir), retriever,
                               workflows=(workflow,), attempts=attempts, seed=seed, style=style,
                               questions=load_split(paths, "train")[:max_questions])


def world_demonstrations(world_dir, tokenizer_dir, tokenizer, retriever, s: "WarmStartSettings", style,
                         workers: int = 1) -> Demonstrations:
    """:func:`make_demonstrations` over the world's training questions in ``s.workflows``; with
    ``workers`` > 1 each workflow in its own spawned process of one thread (tokenizer loaded from
    ``tokenizer_dir``), episodes in the same order. The episodes are those of one process: the
    scripted policy draws from a generator seeded per workflow, and every query is searched alone
    (on seed 0's world, 10,880 episodes, equal to one process at 2 threads; bench/RESULTS.md)."""

    workers = min(workers, len(s.workflows), os.cpu_count() or 1)
    if workers <= 1:
        questions = load_split(WorldPaths.of(world_dir), "train")[:s.max_questions]
        return make_demonstrations(world_dir, tokenizer, retriever, workflows=s.workflows, attempts=s.attempts,
                                   seed=s.seed, style=style, questions=questions)
    out = Demonstrations()
    for part in spawn_map(_demonstrations_in_worker, [(str(world_dir), str(tokenizer_dir), wf, s.attempts, s.seed,
                                                       style, s.max_questions) for wf in s.workflows], workers):
        out.episodes.extend(part.episodes)
        out.stats.update(part.stats)
    return out


def name_token_ids(tokenizer) -> List[int]:
    """Ids of the one-token names of :func:`mopd.recipes.tiny_world.world_kb.name_vocabulary` (as in running
    text, after a space)."""

    ids = [tokenizer.encode(" " + n, add_special_tokens=False) for n in name_vocabulary()]
    return sorted({i[0] for i in ids if len(i) == 1})


def read_pi0(out_dir) -> Optional[dict]:
    """The build marker of ``out_dir`` (None: nothing finished there)."""
    return read_marker(Path(out_dir) / PI0_FILE)


def _world_fingerprint(world_dir) -> str:

    paths = WorldPaths.of(world_dir)
    return corpus_fingerprint(paths.corpus) + ":" + corpus_fingerprint(paths.train)


def build_pi0(world_dir, out_dir, *, steps: int = WarmStartSettings.steps, seed: int = 0, settings: Optional[WarmStartSettings] = None,
              threads: Optional[int] = 1, progress: bool = True, demo_workers: int = 1, **overrides) -> Path:
    """Warm-start pi_0 on the tiny world in ``world_dir`` (from :func:`mopd.recipes.tiny_world.world.build_world`);
    returns ``out_dir`` (a model directory). ``settings`` or keyword ``overrides`` (any
    :class:`WarmStartSettings` field) change the recipe; a finished ``out_dir`` with the same
    recipe and world is returned at once. ``threads``: torch CPU threads from here on (None:
    leave torch's setting). 1 by default: with 2 threads and the other core busy, every small op
    of the tiny model waits for the descheduled thread and training ran 5-50x slower.
    ``demo_workers``: processes that build the demonstrations (one workflow each; the same episodes,
    :func:`world_demonstrations`)."""
    s = settings or WarmStartSettings(steps=steps, seed=seed)
    if overrides:
        s = WarmStartSettings(**{**asdict(s), **overrides})
    out = Path(out_dir)
    wanted = {"format": PI0_FORMAT, "world": _world_fingerprint(world_dir), **asdict(s)}
    wanted["workflows"] = list(s.workflows)
    done = read_pi0(out)
    if done is not None and done.get("settings") == wanted:
        return out

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mopd.recipes.tiny_world.scripted_policy import DemoStyle
    from mopd.recipes.tiny_world.tiny_model import init_tiny_model
    from mopd.retriever import load_retriever, open_retriever

    if threads is not None:
        torch.set_num_threads(threads)
    t_start = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    init_dir = out.with_name(out.name + ".init")
    init_tiny_model(init_dir, corpus_texts=tokenizer_texts(world_dir), vocab_size=s.vocab_size, hidden=s.hidden,
                    layers=s.layers, heads=s.heads, ffn=s.ffn, seed=s.seed)
    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32, attn_implementation="sdpa")
    paths = WorldPaths.of(world_dir)
    retriever = CachedRetriever(load_retriever(RetrieverConfig(kind="inprocess", index=str(paths.index))))
    style = DemoStyle(good_query=s.good_query, right_copy=s.right_copy, right_pick=s.right_pick,
                      search_first=s.search_first, split_pair=s.split_pair, both_facts=s.both_facts)
    t_demo = time.perf_counter()
    demos = Demonstrations()
    demos.extend(world_demonstrations(paths.root, init_dir, tokenizer, retriever, s, style, demo_workers), "world")
    for practice in build_practice_worlds(out.with_name(out.name + "_practice_worlds"), s.seed, s.practice_worlds):
        qs = [q for split in ("train", "dev", "test") for q in load_split(practice, split)][:s.max_questions]
        demos.extend(make_demonstrations(practice.root, tokenizer, CachedRetriever(open_retriever(practice.index)),
                                         workflows=s.workflows, attempts=1, seed=s.seed, style=style, questions=qs),
                     f"practice/{practice.root.name}")
    t_train = time.perf_counter()
    if progress:
        print(f"pi0: {len(demos.episodes)} demonstration episodes in {t_train - t_demo:.0f}s; "
              f"training {s.steps} steps x {s.episodes_per_step} episodes", file=sys.stderr, flush=True)
    torch.manual_seed(s.seed)
    weights = None
    if s.name_weight != 1.0:
        weights = torch.ones(len(tokenizer))
        weights[name_token_ids(tokenizer)] = s.name_weight
    sft = SFTSettings(steps=s.steps, episodes_per_step=s.episodes_per_step, lr=s.lr, seed=s.seed,
                      warmup_frac=s.warmup_frac, weight_decay=s.weight_decay, grad_clip=s.grad_clip,
                      micro_batch_tokens=s.micro_batch_tokens)
    losses = train_sft(model, demos.episodes, sft, pad_id=tokenizer.pad_token_id, token_weights=weights,
                       progress=progress)
    t_end = time.perf_counter()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {"settings": wanted, "demonstrations": demos.stats, "losses": losses,
            "seconds": {"init": round(t_demo - t_start, 1), "demonstrations": round(t_train - t_demo, 1),
                        "sft": round(t_end - t_train, 1), "total": round(t_end - t_start, 1)},
            "parameters": sum(p.numel() for p in model.parameters())}
    (tmp / PI0_FILE).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    shutil.rmtree(init_dir, ignore_errors=True)
    return out
