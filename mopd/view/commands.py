"""`mopd view`: one HTML page of an evaluation's records, a training run's traces, or two side by side.

Handlers import what they run when they run (:mod:`mopd.cli` says why).
"""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "view", help="write one self-contained HTML page of workflows (trees, filters, per-token signal)",
        description="Reads an evaluation directory (records.jsonl), a records .jsonl file, or a training run "
                    "directory (traces.jsonl, written every trainer.trace_every steps); two sources are shown "
                    "side by side, question by question. The page needs no server and no network.")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="one or two evaluation/run directories or records files")
    p.add_argument("--out", default=None,
                   help="the page (default: SOURCE/view.html for one directory, else ./view.html)")
    p.add_argument("--names", nargs="+", default=None, help="a display name per source (default: directory names)")
    p.add_argument("--teacher", default=None, metavar="DIR",
                   help="score the Searcher tokens with this teacher model once (no training step): OPD's "
                        "teacher-minus-old signal per token")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="the tokenizer that decodes token ids (default: the run's model from run.json/config.yaml)")
    p.add_argument("--max-mb", type=float, default=100.0,
                   help="bound of the page file in MiB: workflows are taken in order with their tokens while they fit, "
                        "then with their texts only, then listed without a tree, then left out; the page says "
                        "how many went each way")
    p.add_argument("--title", default=None, help="the page's heading")
    p.add_argument("--serve", action="store_true",
                   help="also serve the page (and nothing else) on 127.0.0.1, to browsers that ask for it by a "
                        "loopback name (Ctrl-C stops)")
    p.add_argument("--port", type=int, default=8000, help="port for --serve (0: any free one)")
    p.set_defaults(func=_view)


def _view(args) -> int:
    from pathlib import Path

    from mopd.core.errors import UserError
    from mopd.view.page import fixed_bytes, write_page
    from mopd.view.page_data import build_page_data
    from mopd.view.sources import model_dir_of, open_source

    if len(args.sources) > 2:
        raise UserError(f"{len(args.sources)} sources: give one, or two to compare")
    if args.names and len(args.names) != len(args.sources):
        raise UserError(f"{len(args.sources)} sources but {len(args.names)} names; give one name per source")
    if not 0 < args.max_mb <= 2 ** 20:      # NaN and inf too
        raise UserError(f"--max-mb {args.max_mb}: give a positive size in MiB (at most 1048576)")
    if args.serve and not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a TCP port (0-65535; 0 picks a free one)")
    systems = [open_source(s, args.names[i] if args.names else None, args.tokenizer)
               for i, s in enumerate(args.sources)]
    if len({s.name for s in systems}) < len(systems):
        raise UserError(f"both sources are named {systems[0].name!r}; give distinct names (--names)")
    if args.teacher:
        from mopd.core.adapter_dir import AdapterDirError, adapter_of, tokenizer_dir
        from mopd.core.model_dir import model_dir_problem
        from mopd.view.teacher_scores import score_searchers
        from mopd.view.token_text import TokenDecoder

        try:   # an adapter directory (the LoRA demo's teacher) is scored as its base with it merged
            adapter = adapter_of(args.teacher)
        except AdapterDirError as e:
            raise UserError(f"--teacher {e}") from None
        problem = None if adapter else model_dir_problem(args.teacher) if Path(args.teacher).is_dir() else \
            "is not a directory"
        if problem:
            raise UserError(f"--teacher {args.teacher} {problem}")
        for s, path in zip(systems, args.sources):
            home = Path(path) if Path(path).is_dir() else Path(path).parent
            print(f"scoring {s.name}'s Searcher tokens with the teacher {args.teacher}")
            s.workflows = score_searchers(list(s.workflows), args.teacher, student_dir=model_dir_of(home))
            if not s.decoder:
                from transformers import AutoTokenizer

                s.decoder = TokenDecoder(AutoTokenizer.from_pretrained(tokenizer_dir(args.teacher)))
    first = Path(args.sources[0])
    out = Path(args.out) if args.out else (first / "view.html" if len(systems) == 1 and first.is_dir()
                                           else Path("view.html"))
    title = args.title or "mopd view: " + " vs ".join(s.name for s in systems)
    fixed = fixed_bytes(title, [{"name": s.name, "source": s.source} for s in systems])
    if fixed >= args.max_mb * 2 ** 20:
        raise UserError(f"--max-mb {args.max_mb:g}: the page's script, style and notes alone take "
                        f"{fixed / 2 ** 20:.3f} MiB; give more")
    data = build_page_data(systems, max_bytes=int(args.max_mb * 2 ** 20) - fixed)
    if not data.workflows:
        raise UserError(f"no workflows in {' '.join(args.sources)}" if not data.dropped else
                        f"--max-mb {args.max_mb:g} leaves no room for even one workflow; give more")
    path = write_page(data, out, title)
    cut = (f"; past --max-mb {args.max_mb:g}: {data.past_bound} without tokens, {data.without_tree} without a tree, "
           f"{data.dropped} left out (the page's footer says so)") if data.past_bound or data.dropped else ""
    print(f"{len(data.workflows)} workflows of {len(data.questions)} questions: {path} "
          f"({path.stat().st_size / 2 ** 20:.1f} MiB; open it in a browser, no server needed){cut}")
    if args.serve:
        from mopd.view.serve import serve

        try:
            serve(path, args.port)
        except OSError as e:
            raise UserError(f"--serve: cannot listen on 127.0.0.1:{args.port}: {e.strerror or e}") from None
    return 0
