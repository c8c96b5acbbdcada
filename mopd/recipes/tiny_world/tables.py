"""The demo page's numbers (docs/demo.md), rendered from the committed reports under docs/ (never typed by hand).

``publish(run, dest)`` copies a finished ``mopd demo`` run (or a ``mopd demo --seeds`` run) into a
docs folder (a run evaluated on both splits: its dev report under dest/dev/); ``update_readme`` rewrites every block of the page
(``PAGE``, docs/demo.md; its links are relative to docs/, where it sits) between
``<!-- demo-tables:NAME -->`` and ``<!-- /demo-tables:NAME -->`` from those folders:

- ``seed0-systems``: avg@4 / pass@4 / 4/4 of every system the page names (``LABELS``; docs/demo/report.md's
  main table);
- ``seed0-claims``: every claim in order with its kind, interval and verdict (docs/demo/claims.json;
  one written before claims had kinds is labelled from its systems);
- ``seed0-timings``: the stage timings of that run (docs/demo/timings.json);
- ``lora-systems``, ``lora-claims``, ``lora-timings``: the same three of the LoRA variant's run
  (`mopd demo --lora`, published to docs/demo_lora), or one line saying none is published;
- ``seeds``: the multi-seed tables (docs/demo_seeds/summary.json: per seed a column per claim and the
  trained Leader's 2+-subtask rate, then each claim pooled), or, while
  no multi-seed run is published, one row per single-seed folder docs/demo_seedN/.

``python -m mopd.recipes.tiny_world.tables [--check]`` is the same as ``mopd demo-docs readme [--check]``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from mopd.recipes.tiny_world.report import (CLAIMS, SHORT_VERDICT, claim_interval, claim_name, claims_table,
                                            per_dataset_section, pooled_table, seed_table, with_claim_fields)
import argparse

LABELS = {"C-MAS base": "C-MAS base (pi_0)", "C-MAS + RL": "C-MAS + RL (Stage I)",
          "H-MAS base": "H-MAS base (pi_0)", "MultiAgent-OPD": "MultiAgent-OPD (Stage II)",
          "No Searcher supervision": "No Searcher supervision (Stage II, Searcher loss 0)",
          "Outcome Searcher": "Outcome Searcher (ablation, last step)",
          "Base teacher": "Base teacher (ablation, last step)"}
"""How the page names each system of the report."""

RUN_FILES = ("timings.json", "demo_settings.json", "environment.json")
REPORT_FILES = ("report.md", "metrics.json", "claims.json", "pi0_check.json")
PAGE = "docs/demo.md"
"""The page whose marked blocks ``update_readme`` rewrites (README.md links it)."""
MARKER = re.compile(r"(<!-- demo-tables:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /demo-tables:(?P=name) -->)", re.S)


def publish(run, dest) -> Path:
    """Copy the reports of ``run`` into ``dest`` (replaced). A multi-seed run (with summary.json)
    publishes its summary and every seed's reports under dest/seedN/."""
    run, dest = Path(run), Path(dest)
    if (run / "summary.json").is_file():
        summary = json.loads((run / "summary.json").read_text())
        _fresh(dest)
        for name in ("summary.json", "summary.md"):
            shutil.copy2(run / name, dest / name)
        for n in summary["seeds"]:
            _publish_one(run / f"seed{n}", dest / f"seed{n}")
        return dest
    _fresh(dest)
    _publish_one(run, dest)
    return dest


def _fresh(dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)


def _publish_one(run: Path, dest: Path) -> None:
    report = run / "report" if (run / "report").is_dir() else run / "report_dev"
    if not (report / "report.md").is_file():
        raise FileNotFoundError(f"{run} holds no finished demo report")
    dest.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        if (run / name).is_file():
            shutil.copy2(run / name, dest / name)
    _copy_report(report, dest)
    if report.name == "report" and (run / "report_dev" / "report.md").is_file():
        # the dev-split evaluation the run's choices were checked on, beside the test one
        (dest / "dev").mkdir()
        _copy_report(run / "report_dev", dest / "dev")


VIEW_LINK = re.compile(r"\[([^\]]*)\]\(view\.html#[^)]*\)")
"""A report's link into the viewer page beside it (``mopd eval report``'s question lists)."""
VIEW_SENTENCE = ("the links open `view.html` beside this report, written by",
                 "the run's own report links each to `view.html` beside it (not kept in this published copy), "
                 "written by")


def _copy_report(report: Path, dest: Path) -> None:
    for name in REPORT_FILES:
        if (report / name).is_file():
            shutil.copy2(report / name, dest / name)
    md = dest / "report.md"
    if md.is_file() and "](view.html#" in (text := md.read_text(encoding="utf-8")):
        # the viewer page (megabytes of inlined records) is not published: its links would dangle
        md.write_text(VIEW_LINK.sub(r"\1", text).replace(*VIEW_SENTENCE), encoding="utf-8")
    for png in sorted(report.glob("*.png")):
        shutil.copy2(png, dest / png.name)


def main_table_rows(report_md: str) -> list[list[str]]:
    """The rows (cells) of the "Main results" table of a report.md."""
    part = report_md.split("## Main results", 1)[1]
    rows = []
    for line in part.splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("System",) or set(cells[0]) <= set(":- "):
            continue
        rows.append(cells)
    return rows


def render_seed0_systems(docs: Path, folder: str = "demo") -> str:
    rows = main_table_rows((docs / folder / "report.md").read_text(encoding="utf-8"))
    out = ["| System | avg@4 | pass@4 | 4/4 |", "|---|---|---|---|"]
    out += ["| " + " | ".join([LABELS.get(r[0], r[0])] + r[1:4]) + " |" for r in rows if r[0] in LABELS]
    return "\n".join(out)


def render_seed0_claims(docs: Path, folder: str = "demo") -> str:
    return claims_table(json.loads((docs / folder / "claims.json").read_text()))


_STAGES = (("world", "world and index"), ("pi0", "pi_0"), ("pi0_check", "pi_0 dev check"),
           ("stage1", "Stage I"), ("stage2", "Stage II"), ("ablation", "ablation"), ("eval", "evaluation"))


def render_seed0_timings(docs: Path, folder: str = "demo") -> str:
    t = json.loads((docs / folder / "timings.json").read_text())
    parts = [f"{label} {t[key]:.0f} s" for key, label in _STAGES if key in t]
    return f"Demo stages of this run: {', '.join(parts)}; {t['total'] / 60:.1f} min in all."


LORA_FOLDER = "demo_lora"
"""Where the LoRA variant's run is published (`mopd demo-docs publish runs/demo_lora docs/demo_lora`)."""


def _lora(render):
    """``render`` of the LoRA variant's published folder, or one line while none is published."""
    def rendered(docs: Path) -> str:
        if not (docs / LORA_FOLDER / "report.md").is_file():
            return (f"No LoRA run is published yet (`mopd demo --lora`, then `mopd demo-docs publish runs/demo_lora "
                    f"docs/{LORA_FOLDER}`).")
        return render(docs, LORA_FOLDER)
    return rendered


def render_seeds(docs: Path) -> str:
    summary_path = docs / "demo_seeds" / "summary.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        links = " ".join(f"[seed {n}](demo_seeds/seed{n}/report.md)" for n in summary["seeds"])
        return "\n".join([seed_table(summary), "", pooled_table(summary), ""] + per_dataset_section(summary)
                         + [f"Reports: {links}."])
    folders = sorted(docs.glob("demo_seed[0-9]*"), key=lambda p: int(p.name[len("demo_seed"):]))
    if not folders:
        return ("No untuned seed of the current demo is published yet (`mopd demo --seeds 1 2 3 4 5`, then "
                "`mopd demo-docs publish runs/demo_seeds docs/demo_seeds`).")
    per = {d: [with_claim_fields(c) for c in json.loads((d / "claims.json").read_text())] for d in folders}
    names = []   # every claim of any folder: those of CLAIMS in its order, then the others as they appear
    for claims in per.values():
        names += [claim_name(c) for c in claims if claim_name(c) not in names]
    order = [claim_name({"trained": k.trained, "base": k.base}) for k in CLAIMS]
    names.sort(key=lambda n: order.index(n) if n in order else len(order))
    out = ["| seed | " + " | ".join(names) + " | demo time | report |", "|" + "---|" * (len(names) + 3)]
    for d, claims in per.items():
        n = d.name[len("demo_seed"):]
        have = {claim_name(c): c for c in claims}
        t = json.loads((d / "timings.json").read_text())
        cells = ["n/a" if name not in have else claim_interval(have[name])
                 + ("" if have[name]["holds"] else SHORT_VERDICT[have[name]["verdict"]]) for name in names]
        link = f"{d.name}/report.md"   # relative to the page, which sits in docs/
        out.append(f"| {n} | " + " | ".join(cells) + f" | {t['total'] / 60:.1f} min | [seed {n}]({link}) |")
    return "\n".join(out)


RENDERERS = {"seed0-systems": render_seed0_systems, "seed0-claims": render_seed0_claims,
             "seed0-timings": render_seed0_timings, "lora-systems": _lora(render_seed0_systems),
             "lora-claims": _lora(render_seed0_claims), "lora-timings": _lora(render_seed0_timings),
             "seeds": render_seeds}


def render_blocks(docs) -> dict[str, str]:
    return {name: fn(Path(docs)) for name, fn in RENDERERS.items()}


def readme_blocks(text: str) -> dict[str, str]:
    """The current text of every marked block of a page (without the markers)."""
    return {m.group("name"): m.group("body").rstrip("\n") for m in MARKER.finditer(text)}


def update_readme(readme=PAGE, docs="docs", check: bool = False) -> list[str]:
    """Rewrite the marked blocks of ``readme`` from ``docs``; returns the names of the blocks that
    changed (with ``check``, that would change; nothing is written)."""
    path = Path(readme)
    text = path.read_text(encoding="utf-8")
    current = readme_blocks(text)
    missing = sorted(set(RENDERERS) - set(current))
    if missing:
        raise ValueError(f"{readme} has no markers for {missing} (<!-- demo-tables:NAME --> ... "
                         "<!-- /demo-tables:NAME -->)")
    rendered = render_blocks(docs)
    changed = [n for n in RENDERERS if current[n] != rendered[n]]
    if changed and not check:
        new = MARKER.sub(lambda m: m.group(1) + rendered[m.group("name")] + "\n" + m.group(4)
                         if m.group("name") in rendered else m.group(0), text)
        path.write_text(new, encoding="utf-8")
    return changed


def main(argv=None) -> int:

    p = argparse.ArgumentParser(prog="python -m mopd.recipes.tiny_world.tables", description=__doc__.split("\n\n")[0])
    p.add_argument("--page", "--readme", dest="readme", metavar="PAGE", default=PAGE, help="the page with the markers")
    p.add_argument("--docs", default="docs")
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    changed = update_readme(args.readme, args.docs, check=args.check)
    print(("out of date: " if args.check else "updated: ") + (", ".join(changed) or "nothing"))
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
