"""`mopd rollout`: workflows run from the command line, records written to a file.

Handlers import what they run when they run (:mod:`mopd.cli` says why).
"""

from __future__ import annotations

from mopd.core.arguments import add_overrides_argument
from mopd.core.workflows import workflow_names


def register(sub) -> None:
    r = sub.add_parser(
        "rollout", help="run C-MAS or H-MAS workflows on a question file and write their records",
        description="Run K workflows per question with the model and the retriever of the config and write "
                    "one WorkflowRecord per line. Sampling defaults to the evaluation settings (eval.temperature, "
                    "eval.top_p, eval.answer_candidates). Config overrides go last, e.g. "
                    "retriever.kind=http retriever.url=http://host:8000 or retriever.index=DIR.")
    r.add_argument("--model", required=True, help="Hugging Face model directory")
    r.add_argument("--workflow", choices=list(workflow_names()), default=None,
                   help="workflow (default: the preset's; without --preset, cmas)")
    r.add_argument("--preset", default=None,
                   help="config preset for limits and retriever (default: cmas_base or hmas_base)")
    r.add_argument("--data", required=True, help="questions: FlashRAG .jsonl or Search-R1 .parquet")
    r.add_argument("--attempts", type=int, default=1, help="workflows per question (K)")
    r.add_argument("--out", required=True, help="records file to write (.jsonl)")
    r.add_argument("--limit", type=int, default=None, help="use only the first N questions")
    r.add_argument("--candidates", type=int, default=None, help="Answerer candidates per request")
    r.add_argument("--temperature", type=float, default=None)
    r.add_argument("--top-p", type=float, default=None)
    r.add_argument("--seed", type=int, default=None, help="sampling seed (default: rollout.seed)")
    r.add_argument("--device", default=None, help="HF engine device: cpu, cuda (default: cuda when available)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_overrides_argument(r)
    r.set_defaults(func=_rollout)


def _rollout(args) -> int:
    import dataclasses
    import time
    from pathlib import Path

    from mopd.config import resolve
    from mopd.core.errors import UserError
    from mopd.core.qa import load_questions
    from mopd.core.records import write_records
    from mopd.core.scoring import exact_match
    from mopd.rollout.engines import build_engine
    from mopd.rollout.run_state import WorkflowSettings
    from mopd.rollout.scheduler import run_workflows
    from mopd.rollout.vllm_engine import EngineUnavailable

    if args.attempts < 1:
        raise UserError("--attempts must be >= 1")
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit {args.limit}: must be >= 1 (leave it out to use every question)")
    if Path(args.out).is_dir():
        raise UserError(f"--out {args.out} is a directory; give the records file to write, e.g. "
                        f"{Path(args.out) / 'records.jsonl'}")
    if not Path(args.model).is_dir():
        raise UserError(f"model directory {args.model} does not exist")
    cfg = resolve(args.preset or f"{args.workflow or 'cmas'}_base", args.overrides)
    workflow = args.workflow or cfg.rollout.workflow
    questions, _report = load_questions(args.data, skip_malformed=cfg.data.skip_malformed)
    questions = questions[:args.limit] if args.limit is not None else questions
    if not questions:
        raise UserError(f"{args.data} holds no questions")
    try:
        engine = build_engine(cfg.rollout, args.model, device=args.device, dtype=cfg.model.dtype)
        retriever = _retriever(cfg)
    except EngineUnavailable as e:
        raise UserError(str(e)) from None
    start = time.perf_counter()
    try:
        settings = WorkflowSettings.for_evaluation(cfg, workflow, seed=args.seed)
        settings = dataclasses.replace(
            settings, answer_candidates=args.candidates or settings.answer_candidates,
            temperature=settings.temperature if args.temperature is None else args.temperature,
            top_p=args.top_p or settings.top_p)
        records = run_workflows(engine, retriever, engine.tokenizer, questions, settings, attempts=args.attempts,
                                method=cfg.method, progress=not args.no_progress)
    except ValueError as e:
        raise UserError(str(e)) from None
    seconds = time.perf_counter() - start
    write_records(args.out, records)
    n = len(records)
    em = sum(exact_match(r.final_answer, r.answers) for r in records) / n
    out_tokens = sum(r.output_tokens for r in records)
    print(f"{n} {workflow} workflows on {len(questions)} questions in {seconds:.1f}s "
          f"({out_tokens / max(seconds, 1e-9):.0f} generated tokens/s); EM {em:.3f}; "
          f"search actions {sum(r.search_actions for r in records) / n:.2f}/workflow; "
          f"invalid calls {sum(c.invalid for r in records for c in r.calls)}; records: {args.out}")
    return 0


def _retriever(cfg):
    from mopd.core.errors import UserError

    try:
        from mopd.retriever import load_retriever

        return load_retriever(cfg.retriever)
    except (OSError, ValueError, RuntimeError) as e:
        raise UserError(f"retriever ({cfg.retriever.kind}): {e}") from None
