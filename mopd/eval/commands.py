"""`mopd eval run|report` (K-attempt evaluation and reports) and `mopd score` (EM of a records file).

Handlers import what they run when they run (:mod:`mopd.cli` says why).
"""

from __future__ import annotations

from mopd.core.arguments import add_overrides_argument
from mopd.core.model_dir import remote_code_trusted, trust_remote_code
from mopd.core.workflows import workflow_names


def register(sub) -> None:
    from mopd.config import EvalConfig

    defaults = EvalConfig()
    p = sub.add_parser("eval", help="evaluate checkpoints (K attempts per question) and report metrics")
    esub = p.add_subparsers(dest="eval_command", metavar="ACTION")

    run = esub.add_parser(
        "run", help="run K independent workflows per question and record them (resumable)",
        description="One Answerer candidate per request, temperature 0.6, top-p 0.95, 8192/512 token limits "
                    "(the eval.* and rollout.* config keys); records go to OUT/records.jsonl. A killed run "
                    "continues with the questions it has not finished when started again with the same OUT "
                    "(and the same settings, model, retriever and engine). The retriever must be named: "
                    "retriever.index=DIR, retriever.kind=http retriever.url=URL, or retriever.index=bundled for "
                    "the bundled toy corpus. On a GPU the engine is vLLM unless rollout.engine is set.")
    run.add_argument("--model", required=True, help="model directory (Hugging Face format), or a LoRA adapter "
                     "directory (PEFT format, `mopd export --adapter`) evaluated over the base it names")
    run.add_argument("--workflow", required=True, choices=list(workflow_names()), help="cascade or hierarchy")
    run.add_argument("--manifest", required=True, help="test questions (FlashRAG .jsonl or Search-R1 .parquet)")
    run.add_argument("--attempts", type=int, default=None,
                     help=f"independent workflows per question (default eval.attempts = {defaults.attempts})")
    run.add_argument("--out", required=True, help="run directory (records.jsonl, run.json)")
    run.add_argument("--method", default="", help="name stored in the records (default: the model directory name)")
    run.add_argument("--preset", default=None, help="config preset whose rollout settings to use")
    run.add_argument("--file", dest="yaml_file", default=None, help="YAML config applied on top of the preset")
    run.add_argument("--limit", type=int, default=None, help="only the first N questions of the manifest")
    run.add_argument("--chunk", type=int, default=32, help="questions per rollout batch (records saved after each)")
    run.add_argument("--keep-token-ids", action="store_true",
                     help="keep token ids and sampling log-probs in the records (texts are always kept)")
    add_overrides_argument(run)
    run.set_defaults(func=_run)

    rep = esub.add_parser(
        "report", help="metrics with paired bootstrap intervals, costs and diagnostics of one or more runs",
        description="Per dataset and macro avg@K, pass@K, K/K and the n_i distribution (strict and flexible "
                    "EM), paired question-bootstrap intervals and differences against a reference, costs, "
                    "format and collapse diagnostics. Writes report.md, metrics.json and PNG plots.")
    rep.add_argument("runs", nargs="+", metavar="RUN", help="run directories (with records.jsonl) or .jsonl files")
    rep.add_argument("--names", nargs="+", default=None, help="one display name per run (default: directory names)")
    rep.add_argument("--reference", default=None, help="system the differences are taken against (default: first)")
    rep.add_argument("--out", default="eval_report", help="output directory (default: ./eval_report)")
    rep.add_argument("--draws", type=int, default=defaults.bootstrap_draws, help="bootstrap draws")
    rep.add_argument("--seed", type=int, default=defaults.bootstrap_seed, help="bootstrap seed")
    rep.add_argument("--intersect", action="store_true",
                     help="compare on the questions all runs share (what is left out is reported) "
                          "instead of stopping at the first missing one")
    rep.add_argument("--collapse", nargs="+", default=None, metavar="STEP=RUN",
                     help="checkpoint records for the search-collapse table, e.g. 300=runs/step300")
    rep.add_argument("--val-log", nargs="+", default=(), metavar="METRICS_JSONL",
                     help="trainer metrics.jsonl files to plot validation curves from")
    rep.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    rep.add_argument("--title", default="Evaluation report")
    rep.add_argument("--section", action="append", default=[], metavar="MARKDOWN_FILE",
                     help="a markdown file placed after the report's introduction (repeatable; a pipeline's "
                          "teacher check)")
    rep.set_defaults(func=_report)
    _register_score(sub)


def _run(args) -> int:
    from pathlib import Path

    from mopd.config import resolve
    from mopd.core.errors import UserError
    from mopd.core.qa import DataError, load_questions
    from mopd.eval.alignment import EvalError
    from mopd.eval.ranks import check_rank_continuation, join_ranks, run_ranked_evaluation
    from mopd.eval.runner import EvalPlan, Rollout, manifest_fingerprint

    cfg = resolve(args.preset, args.overrides, args.yaml_file)
    trust_remote_code(cfg.model.trust_remote_code)
    import torch

    cuda = torch.cuda.is_available()
    ranks = join_ranks()   # under torchrun: this rank of N, on its own GPU, with its own engine
    engine_line = choose_engine(cfg, engine_set_by_user(args), cuda, cuda and vllm_installed())
    attempts = args.attempts if args.attempts is not None else cfg.eval.attempts
    if attempts < 1:
        raise UserError("--attempts must be >= 1")
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit {args.limit}: give the number of questions to evaluate (1 or more), or leave "
                        "it out for all of them")
    if args.chunk < 1:
        raise UserError(f"--chunk {args.chunk}: questions per rollout batch must be 1 or more")
    try:
        questions, _ = load_questions(args.manifest, skip_malformed=cfg.data.skip_malformed)
    except DataError as e:
        raise UserError(str(e)) from None
    manifest = manifest_fingerprint(questions)    # all of them: a continued run may raise --limit
    if args.limit is not None:
        questions = questions[:args.limit]
    if not questions:
        raise UserError(f"{args.manifest} has no questions")
    from mopd.core.out_path import out_dir_problem

    if out_dir_problem(args.out):
        raise UserError(f"--out {args.out} {out_dir_problem(args.out)}")
    if not Path(args.model).is_dir():
        raise UserError(f"--model {args.model}: no such model directory")
    from mopd.core.adapter_dir import AdapterDirError
    from mopd.core.model_dir import model_dir_problem
    from mopd.core.adapter_dir import adapter_of

    try:   # an adapter directory (mopd export --adapter): evaluated over the base it names, checked
        adapter = adapter_of(args.model)
    except AdapterDirError as e:
        raise UserError(f"--model {e}") from None
    base = adapter.base_dir if adapter is not None else args.model   # weights, tokenizer, template, context
    problem = model_dir_problem(base)
    if problem:
        what = f"--model {args.model}'s base {base}" if adapter is not None else f"--model {args.model}"
        raise UserError(f"{what}: {problem}" if problem.startswith("this is") else f"{what} {problem}")
    retriever_id = _retriever_identity(cfg)
    try:
        from mopd.rollout.async_scheduler import run_rollout as run_workflows
    except ImportError as e:
        raise UserError(f"the rollout scheduler is not available ({e})") from None
    from mopd.retriever import load_retriever
    from mopd.rollout.engines import build_engine, evaluation_dtype

    from transformers import AutoTokenizer

    from mopd.rollout.chat import check_chat_template
    from mopd.rollout.context import fit_context

    # Before any engine starts: a template that cannot be continued, or limits past the context.
    tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=remote_code_trusted())
    from mopd.core.model_weights import weights_problem

    problem = weights_problem(base, tokenizer_len=len(tokenizer))   # truncated, another size, tokenizer
    if problem:
        raise UserError(f"--model {problem}")
    check_chat_template(tokenizer, cfg.model.chat_template_kwargs, name=base)
    cfg = fit_context(cfg, base)
    method = args.method or Path(args.model).resolve().name
    try:   # a continued evaluation with other settings (model, retriever, engine, ...) is refused now
        plan = EvalPlan(args.out, evaluation_settings(cfg, args), attempts=attempts,
                        method=method, chunk_questions=args.chunk, keep_token_ids=args.keep_token_ids,
                        run_info={"model": str(Path(args.model).resolve()), "manifest": args.manifest},
                        model=evaluated_model(args.model, adapter), retriever=retriever_id, engine=cfg.rollout.engine,
                        manifest=manifest)
        check_rank_continuation(ranks, plan)
    except EvalError as e:
        raise UserError(str(e)) from None
    try:   # before the engine, so that what the retriever holds on the GPU counts when vLLM's share is chosen
        retriever = load_retriever(cfg.retriever)
    except (OSError, ValueError, RuntimeError) as e:
        raise UserError(f"retriever ({cfg.retriever.kind}): {e}") from None
    if engine_line:
        print(engine_line)
    share_line = fill_memory_share(cfg, cuda)
    if share_line:
        print(share_line)
    engine = build_engine(cfg.rollout, args.model, dtype=evaluation_dtype(cfg.rollout, cfg.eval))
    tokenizer = getattr(engine, "tokenizer", None) or tokenizer
    try:
        path = run_ranked_evaluation(ranks, Rollout(engine, retriever, tokenizer, run_workflows), questions, plan,
                                     progress=True, log=print)
    except EvalError as e:
        raise UserError(str(e)) from None
    except Exception as e:
        from mopd.core.peers import raise_if_peer_lost

        raise_if_peer_lost(e, f"the finished questions are kept under {args.out} (its rank parts): run the "
                              "same command again to evaluate the rest")
        raise
    finally:
        ranks.leave()
    if ranks.rank != 0:
        return 0
    from mopd.core.records import format_validity_line, iter_records

    print(format_validity_line(iter_records(path)))
    print(f"records: {path}")
    return 0


def evaluated_model(path: str, adapter) -> dict:
    """The fingerprint a continued evaluation must match: the model directory's; for an adapter
    (``adapter``: its :class:`mopd.core.adapter_dir.AdapterDir`), the adapter's weights, the base's
    weights and the base's chat template (the one the prompts are rendered with)."""
    from mopd.core.fingerprint import model_fingerprint

    own = model_fingerprint(path)
    if adapter is None:
        return own
    base = model_fingerprint(adapter.base_dir)
    return {**own, "chat_template": base["chat_template"], "base_weights": base["weights"]}


def set_by_user(args, key: str) -> bool:
    """Whether the command line or the YAML file sets the dotted config ``key``."""
    from mopd.config import normalize_overrides

    if any(o.split("=", 1)[0].strip() == key for o in normalize_overrides(list(args.overrides or []))):
        return True
    if args.yaml_file:
        from omegaconf import OmegaConf

        return OmegaConf.select(OmegaConf.load(args.yaml_file), key, default=None) is not None
    return False


def engine_set_by_user(args) -> bool:
    """Whether the command line, the YAML file or the preset sets ``rollout.engine``."""
    from mopd.config import PRESETS, RolloutConfig

    if set_by_user(args, "rollout.engine"):
        return True
    return bool(args.preset) and args.preset in PRESETS and \
        PRESETS[args.preset]().rollout.engine != RolloutConfig().engine


def evaluation_settings(cfg, args):
    """The workflow settings of ``mopd eval run``: evaluation sampling, and the paper's step limit
    for a workflow other than the config's, unless ``rollout.max_steps`` was set by the user (it
    was silently replaced by 12 for ``--workflow hmas`` under the default cmas config)."""
    import dataclasses

    from mopd.rollout.run_state import WorkflowSettings

    settings = WorkflowSettings.for_evaluation(cfg, args.workflow)
    if set_by_user(args, "rollout.max_steps"):
        settings = dataclasses.replace(settings, max_steps=cfg.rollout.max_steps)
    return settings


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def choose_engine(cfg, engine_set: bool, cuda: bool, have_vllm: bool) -> str:
    """On a GPU, evaluation runs on vLLM (as the paper's) unless ``rollout.engine`` was set: sets
    ``cfg.rollout.engine`` and returns a line saying so ("" when nothing was chosen). Without vLLM
    (the gpu extra) it stays on the HF engine, and the line says that instead."""
    if engine_set or not cuda or cfg.rollout.engine == "vllm":
        return ""
    if not have_vllm:
        return ("rollout.engine hf: vLLM, the default on a GPU, is not installed (pip install 'mopd[gpu]'); "
                "set rollout.engine=hf to silence this")
    cfg.rollout.engine = "vllm"
    return "rollout.engine vllm: evaluation on a GPU runs on vLLM (set rollout.engine=hf for transformers)"


def fill_memory_share(cfg, cuda: bool) -> str:
    """vLLM's share of the GPU when ``rollout.gpu_memory_utilization`` is empty: what is free now less
    the headroom, at most 0.85 (``mopd.config.free_memory_share``); returns the line saying so."""
    if cfg.rollout.engine != "vllm" or cfg.rollout.gpu_memory_utilization is not None or not cuda:
        return ""
    import torch

    from mopd.config import free_memory_share

    free, total = torch.cuda.mem_get_info()
    share = free_memory_share(free / 2 ** 30, total / 2 ** 30)
    if share <= 0:
        from mopd.core.errors import UserError

        raise UserError(f"the GPU has {free / 2 ** 30:.1f} of {total / 2 ** 30:.0f} GiB free: no room for vLLM "
                        "(set rollout.gpu_memory_utilization, or free the GPU)")
    cfg.rollout.gpu_memory_utilization = share
    return (f"rollout.gpu_memory_utilization {share:.2f}: what is free on this GPU ({free / 2 ** 30:.1f} of "
            f"{total / 2 ** 30:.0f} GiB) less the headroom, at most 0.85 (set rollout.gpu_memory_utilization "
            "to choose it)")


def _retriever_identity(cfg) -> dict:
    """The retriever the evaluation reads, as its run.json records it; no retriever (or one that
    cannot be reached or read) is one line."""
    from mopd.core.errors import UserError
    from mopd.retriever import IndexDirError, NoRetriever, RetrieverUnavailable, retriever_identity

    try:
        return retriever_identity(cfg.retriever)
    except NoRetriever as e:
        raise UserError(str(e)) from None
    except IndexDirError as e:
        raise UserError(f"retriever.index={cfg.retriever.index}: {e}") from None
    except RetrieverUnavailable as e:
        raise UserError(f"retriever.url: {e}") from None


def _parse_collapse(items):
    from mopd.core.errors import UserError

    out = {}
    for it in items or ():
        step, sep, path = it.partition("=")
        if not sep or not step.strip().lstrip("-").isdigit() or not path:
            raise UserError(f"--collapse {it!r}: expected STEP=RUN, e.g. 300=runs/step300")
        out[int(step)] = path
    return out


def _report(args) -> int:
    from pathlib import Path

    from mopd.core.errors import UserError
    from mopd.eval.alignment import EvalError
    from mopd.eval.report import ReportOptions, report_runs

    if args.draws < 1:
        raise UserError("--draws must be >= 1")
    from mopd.core.out_path import out_dir_problem

    problem = out_dir_problem(args.out)       # before the records are read and bootstrapped
    if problem:
        raise UserError(f"--out {args.out} {problem}")
    collapse = _parse_collapse(args.collapse)
    missing = [f for f in args.section if not Path(f).is_file()]
    if missing:
        raise UserError(f"--section {missing[0]}: no such file")
    try:
        options = ReportOptions(names=args.names, reference=args.reference, draws=args.draws, seed=args.seed,
                                intersect=args.intersect, collapse_runs=collapse, validation_logs=args.val_log,
                                make_plots=not args.no_plots, title=args.title,
                                top_sections="\n".join(Path(f).read_text(encoding="utf-8") for f in args.section))
        path = report_runs(args.runs, args.out, options)
    except (EvalError, ValueError) as e:
        raise UserError(str(e)) from None
    print(f"report: {path}")
    print(f"metrics: {path.parent / 'metrics.json'}")
    return 0


# --------------------------------------------------------------------------------------------
# `mopd score --records FILE`: strict and flexible EM of a records file.
# --------------------------------------------------------------------------------------------


def _register_score(sub) -> None:
    p = sub.add_parser("score", help="strict and flexible exact match of a workflow records file",
                       description="Score each workflow by its final Answerer output: strict EM uses the "
                                   "text of the last complete <answer> tag; flexible EM applies the paper's "
                                   "six extraction rules. Prints per-dataset and macro means.")
    p.add_argument("--records", required=True, nargs="+", metavar="FILE", help="records .jsonl file(s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=_score)


def score_records(records) -> dict:
    """Per dataset and macro (datasets weighted equally): n, strict EM, flexible EM."""
    from collections import defaultdict

    from mopd.core.scoring import exact_match, extract_answer, flexible_extract

    per = defaultdict(lambda: [0, 0.0, 0.0])
    for r in records:
        last = r.candidates[-1] if r.candidates else None
        row = per[r.dataset]
        row[0] += 1
        row[1] += exact_match(extract_answer(last), r.answers)
        row[2] += exact_match(flexible_extract(last), r.answers)
    out = {ds: {"n": n, "strict_em": s / n, "flexible_em": f / n} for ds, (n, s, f) in sorted(per.items())}
    if out:
        out["macro"] = {
            "n": sum(v["n"] for v in out.values()),
            "strict_em": sum(v["strict_em"] for v in out.values()) / len(out),
            "flexible_em": sum(v["flexible_em"] for v in out.values()) / len(out),
        }
    return out


def _score(args) -> int:
    import json

    from mopd.core.errors import UserError
    from mopd.core.records import read_records

    records = [r for f in args.records for r in read_records(f)]
    if not records:
        raise UserError(f"no records in {' '.join(args.records)}")
    table = score_records(records)
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    print(f"{'dataset':24s} {'n':>7s} {'strict EM':>10s} {'flex EM':>10s}")
    for ds, v in table.items():
        print(f"{ds:24s} {v['n']:7d} {100 * v['strict_em']:9.2f}% {100 * v['flexible_em']:9.2f}%")
    return 0
