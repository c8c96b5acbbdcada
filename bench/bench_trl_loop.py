"""Inside TRL's own training loop: FusedGRPOTrainer against TRL's GRPOTrainer, CPU, and the cold cost.

Run it in the integrations environment (TRL 1.16, make test-integrations builds it):

    .venv-integrations/bin/python bench/bench_trl_loop.py                      # both parts
    .venv-integrations/bin/python bench/bench_trl_loop.py --threads 2 --rounds 1 --steps 3
    .venv-integrations/bin/python bench/bench_trl_loop.py --skip-loop          # the cold/warm part only

**Part 1, the training loop.** One tiny random Qwen2 (``kernels/tests/integrations/tiny_models.py``:
vocabulary ``--vocab`` 32,768, hidden ``--hidden`` 128, 2 layers, untied lm head, so that the lm head
is most of the model's work), the same prompts, reward and ``GRPOConfig`` for every trainer:
``loss_type="dapo"`` (TRL's default) with ``beta=0.04`` (and TRL's default
``use_bias_correction_kl=True``), ``per_device_train_batch_size = num_generations = --batch`` 8,
``max_completion_length`` ``--completion`` 128 (a random model almost never samples EOS: every
completion is full length), fp32 (``bf16=False``), AdamW, ``--steps`` optimizer steps. Three trainers:

- ``trl``: ``trl.GRPOTrainer``, whose loss scores the completions with its own chunked lm head
  (``add_fused_lm_head``, ``ChunkedLogProbFunction``; on CPU it scores every position, prompt too)
  and then computes the loss from the log-probs;
- ``fused-compiled``: ``mopd_kernels.integrations.trl.FusedGRPOTrainer`` with the compiled CPU row
  pass (``set_compiled_cpu_rows(True)`` before the first step: it compiles inside step 1);
- ``fused-eager``: the same with the eager row pass (``set_compiled_cpu_rows(False)``).

Each run is a fresh process that seeds torch and builds its trainer right before training (as the
integration test does), so all three sample the same completions; the runs alternate
(trl, fused-compiled, fused-eager, then rotated) for ``--rounds`` rounds at each thread count
(``torch.set_num_threads``). Per step it records: ``generation`` (``_prepare_inputs``: sampling,
rewards, the reference model's log-probs; the same code in all three), ``loss`` (``compute_loss``:
backbone forward, lm head and loss), ``backward`` (``accelerator.backward``), and the whole step
(``on_step_begin`` to ``on_step_end``: all of these plus the optimizer). Step 1 is reported apart
(the warm-up; for ``fused-compiled`` it holds the compilation: the first such process in a run uses
an empty inductor cache, ``TORCHINDUCTOR_CACHE_DIR`` under ``--work``, later ones find it filled);
the medians are over steps 2.. of all rounds.

Peak memory: the peak RSS of the process over ``compute_loss`` + backward of a step
(``/proc/self/clear_refs`` at its start, ``VmHWM`` after the backward, minus the RSS at its start),
with glibc's mmap threshold at 128 KiB (``MALLOC_MMAP_THRESHOLD_``) in every run, so that freed
tensors leave RSS at once: the same measure for every trainer; it counts everything (tensors,
autograd's saved activations, BLAS scratch), not only the lm head. Median over steps 2...

**Part 2, cold vs warm for a library user.** ``FusedLinearGRPOLoss`` forward + backward on a new
shape, ``--cold-shape`` T,H,V (default 4096,512,32768, ``mopd_kernels.bench``'s inputs), in fresh
processes at ``--cold-threads``: the first call against the median of the next ``--cold-calls``
calls, with the compiled row pass and an empty inductor cache, with it and the cache that run left
(a second process), and with the default eager pass. The ratio first / steady is the surprise a
user meets on a first call.

The tables print as markdown rows (with the load averages seen during each run, 1-minute);
``--out`` writes every measurement as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "kernels", "tests", "integrations")
VARIANTS = ("trl", "fused-compiled", "fused-eager")


# ---------------------------------------------------------------------------------------------
# Part 1 child: one trainer, several steps
# ---------------------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def child_loop(a) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, TESTS)
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mopd_kernels.compiled_rows import set_compiled_cpu_rows
    from mopd_kernels.integrations.trl import FusedGRPOTrainer
    from tiny_models import grpo_dataset, reward_len

    cls = GRPOTrainer if a.child == "trl" else FusedGRPOTrainer
    set_compiled_cpu_rows(a.child == "fused-compiled")
    config = GRPOConfig(output_dir=os.path.join(a.work, "out", a.child), per_device_train_batch_size=a.batch,
                        num_generations=a.batch, max_completion_length=a.completion, max_steps=a.steps,
                        logging_steps=1, report_to="none", use_vllm=False, bf16=False, use_cpu=True,
                        save_strategy="no", seed=0, dataloader_num_workers=0, loss_type="dapo", beta=0.04,
                        disable_tqdm=True)
    torch.manual_seed(0)
    trainer = cls(model=AutoModelForCausalLM.from_pretrained(a.model_dir), reward_funcs=reward_len, args=config,
                  train_dataset=grpo_dataset(4 * a.steps), processing_class=AutoTokenizer.from_pretrained(a.model_dir))
    steps, cur = [], {}

    prepare, compute_loss, backward = trainer._prepare_inputs, trainer.compute_loss, trainer.accelerator.backward

    def timed_prepare(*args, **kwargs):
        t0 = time.perf_counter()
        out = prepare(*args, **kwargs)
        cur["generation"] = cur.get("generation", 0.0) + time.perf_counter() - t0
        return out

    def timed_loss(*args, **kwargs):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")   # VmHWM := current RSS
        cur["rss_before"] = _status_kib("VmRSS")
        t0 = time.perf_counter()
        out = compute_loss(*args, **kwargs)
        cur["loss"] = cur.get("loss", 0.0) + time.perf_counter() - t0
        return out

    def timed_backward(*args, **kwargs):
        t0 = time.perf_counter()
        out = backward(*args, **kwargs)
        cur["backward"] = cur.get("backward", 0.0) + time.perf_counter() - t0
        cur["peak_mib"] = (_status_kib("VmHWM") - cur["rss_before"]) / 1024
        return out

    trainer._prepare_inputs, trainer.compute_loss, trainer.accelerator.backward = (timed_prepare, timed_loss,
                                                                                     timed_backward)

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            cur.clear()
            cur["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            rec = {k: v for k, v in cur.items() if k not in ("t0", "rss_before")}
            rec["step"] = time.perf_counter() - cur["t0"]
            rec["loss+backward"] = rec.get("loss", 0.0) + rec.get("backward", 0.0)
            rec["load"] = os.getloadavg()[0]
            steps.append(rec)

    trainer.add_callback(StepTimer())
    trainer.train()
    logged = [e for e in trainer.state.log_history if "loss" in e]
    return dict(variant=a.child, threads=a.threads, steps=steps, torch_threads=torch.get_num_threads(),
                losses=[e["loss"] for e in logged], completion_length=[e.get("completions/mean_length") for e in logged])


# ---------------------------------------------------------------------------------------------
# Part 2 child: first call vs steady calls of the library loss
# ---------------------------------------------------------------------------------------------


def child_cold(a) -> dict:
    t_start = time.perf_counter()
    import torch

    torch.set_num_threads(a.threads)
    from mopd_kernels.bench import make_inputs, variant_ours
    from mopd_kernels.compiled_rows import set_compiled_cpu_rows

    t_import = time.perf_counter() - t_start
    T, H, V = (int(x) for x in a.cold_shape.split(","))
    set_compiled_cpu_rows(False)   # the inputs' log-probs: no compilation before the first measured call
    inp = make_inputs(T, H, V, torch.float32, torch.device("cpu"), 512, 1.0)
    set_compiled_cpu_rows(a.child == "cold-compiled")
    call, h, w = variant_ours(inp, True)
    times = []
    for _ in range(1 + a.cold_calls):
        h.grad = w.grad = None
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return dict(variant=a.child, threads=a.threads, first=times[0], steady=statistics.median(times[1:]),
                times=times, import_s=t_import, load=os.getloadavg()[0],
                cache_dir=os.environ.get("TORCHINDUCTOR_CACHE_DIR"))


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def run_child(args_list, env) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__)] + args_list
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def _ms(x: float) -> str:
    return f"{x * 1e3:.0f} ms"


def loop_table(runs) -> None:
    print("\nPart 1: inside TRL's loop (medians over steps 2.. of all rounds; peak = peak RSS over compute_loss + "
          "backward; ratios are trainer / trl)\n")
    print("| threads | trainer | loss fwd+bwd | / trl | whole step | / trl | generation | peak RSS, loss+bwd | / trl "
          "| step 1 loss+bwd (cold) | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for threads in sorted({r["threads"] for r in runs}):
        med = {}
        for v in VARIANTS:
            rs = [r for r in runs if r["threads"] == threads and r["variant"] == v]
            if not rs:
                continue
            later = [s for r in rs for s in r["steps"][1:]]
            med[v] = dict(lb=statistics.median(s["loss+backward"] for s in later),
                          step=statistics.median(s["step"] for s in later),
                          gen=statistics.median(s.get("generation", 0.0) for s in later),
                          peak=statistics.median(s["peak_mib"] for s in later),
                          first=[f"{r['steps'][0]['loss+backward']:.1f}" + ("*" if r.get("inductor_cache_empty") and
                                 v == "fused-compiled" else "") for r in rs],
                          loads=[s["load"] for r in rs for s in r["steps"]])
        base = med.get("trl")
        for v, m in med.items():
            def ratio(k):
                return f"{m[k] / base[k]:.2f}x" if base else "-"
            print(f"| {threads} | {v} | {_ms(m['lb'])} | {ratio('lb')} | {_ms(m['step'])} | {ratio('step')} | "
                  f"{_ms(m['gen'])} | {m['peak']:.0f} MiB | {ratio('peak')} | "
                  f"{', '.join(m['first'])} s | {min(m['loads']):.1f}-{max(m['loads']):.1f} |",
                  flush=True)
    print("\nstep 1 loss+bwd: one value per process (round); * = the inductor cache was empty (the compile is in it)")


def cold_table(runs, shape) -> None:
    print(f"\nPart 2: a library user's first FusedLinearGRPOLoss forward+backward on a new shape ({shape}) vs "
          "steady-state calls, fresh processes\n")
    print("| row pass | inductor cache | threads | first call | steady call (median) | first / steady | "
          "import | load |")
    print("|---|---|---|---|---|---|---|---|")
    labels = {"cold-compiled": ("compiled (`set_compiled_cpu_rows(True)`)", "empty"),
              "warm-compiled": ("compiled (`set_compiled_cpu_rows(True)`)", "filled by the run above"),
              "cold-eager": ("eager (the library default)", "-")}
    for r in runs:
        mode, cache = labels[r["label"]]
        print(f"| {mode} | {cache} | {r['threads']} | {r['first']:.2f} s | {r['steady']:.2f} s | "
              f"{r['first'] / r['steady']:.1f}x | {r['import_s']:.1f} s | {r['load']:.1f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description="FusedGRPOTrainer vs GRPOTrainer inside TRL's loop; cold vs warm calls")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=2, help="processes per trainer and thread count")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per process (step 1 is the warm-up)")
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="completions per step (= num_generations)")
    p.add_argument("--completion", type=int, default=128, help="max_completion_length")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--cold-shape", default="4096,512,32768")
    p.add_argument("--cold-threads", default="2")
    p.add_argument("--cold-calls", type=int, default=3)
    p.add_argument("--skip-loop", action="store_true")
    p.add_argument("--skip-cold", action="store_true")
    p.add_argument("--work", default=None, help="directory for the model, outputs and inductor caches (default: a "
                                                "new temporary one)")
    p.add_argument("--out")
    p.add_argument("--child", choices=list(VARIANTS) + ["cold-compiled", "cold-eager"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        a.threads = int(a.threads)
        out = child_cold(a) if a.child.startswith("cold") else child_loop(a)
        print("RESULT " + json.dumps(out), flush=True)
        return
    work = a.work or tempfile.mkdtemp(prefix="bench_trl_loop_")
    os.makedirs(work, exist_ok=True)
    print(f"bench_trl_loop: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()}, work dir {work}", flush=True)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", HF_HUB_OFFLINE="1",
               TORCHINDUCTOR_CACHE_DIR=os.path.join(work, "inductor_loop"))
    common = ["--batch", str(a.batch), "--completion", str(a.completion), "--steps", str(a.steps), "--work", work]
    result = dict(config=vars(a), loop=[], cold=[])
    if not a.skip_loop:
        sys.path.insert(0, TESTS)
        from tiny_models import tiny_causal_lm_dir

        model_dir = os.path.join(work, "model")
        if not os.path.exists(os.path.join(model_dir, "config.json")):
            os.makedirs(model_dir, exist_ok=True)
            tiny_causal_lm_dir(model_dir, vocab=a.vocab, hidden=a.hidden, layers=2)
        variants = [v for v in a.variants.split(",") if v]
        for threads in a.threads.split(","):
            for r in range(a.rounds):
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                for v in order:
                    cache = env["TORCHINDUCTOR_CACHE_DIR"]
                    cold = not os.path.isdir(cache) or not os.listdir(cache)
                    res = run_child(["--child", v, "--threads", threads, "--model-dir", model_dir] + common, env)
                    res["round"], res["inductor_cache_empty"] = r, cold
                    result["loop"].append(res)
                    print(f"  {threads} threads, round {r}, {v}: loss+bwd "
                          + ", ".join(f"{s['loss+backward']:.2f}" for s in res["steps"]) + " s; step "
                          + ", ".join(f"{s['step']:.2f}" for s in res["steps"]) + " s; peak "
                          + ", ".join(f"{s['peak_mib']:.0f}" for s in res["steps"]) + " MiB; load "
                          + ", ".join(f"{s['load']:.1f}" for s in res["steps"]) + f"; losses {res['losses']}",
                          flush=True)
        loop_table(result["loop"])
    if not a.skip_cold:
        for threads in a.cold_threads.split(","):
            cache = os.path.join(work, f"inductor_cold_{threads}_{int(time.time())}")
            cenv = dict(env, TORCHINDUCTOR_CACHE_DIR=cache)
            cenv.pop("MALLOC_MMAP_THRESHOLD_")
            runs = [("cold-compiled", "cold-compiled"), ("warm-compiled", "cold-compiled"), ("cold-eager", "cold-eager")]
            for label, child in runs:
                res = run_child(["--child", child, "--threads", threads, "--cold-shape", a.cold_shape,
                                 "--cold-calls", str(a.cold_calls)], cenv)
                res["label"] = label
                result["cold"].append(res)
                print(f"  cold part, {label}, {threads} threads: " + ", ".join(f"{t:.2f}" for t in res["times"])
                      + f" s (load {res['load']:.1f})", flush=True)
        cold_table(result["cold"], a.cold_shape)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
