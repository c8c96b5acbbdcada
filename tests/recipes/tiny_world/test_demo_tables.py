"""The demo page's numbers (docs/demo.md) come from the committed reports under docs/: the marked blocks
equal what `mopd demo-docs readme` renders, and the numbers in them equal the reports' own."""

import json
import re
from pathlib import Path

import pytest

from mopd.recipes.tiny_world.tables import main_table_rows, publish, readme_blocks, render_blocks, update_readme

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "demo.md"
NUM = r"([+-]\d+\.\d\d) \[([+-]\d+\.\d\d), ([+-]\d+\.\d\d)\]"


def _pp(x):
    return f"{100 * x:+.2f}"


def test_readme_blocks_are_the_rendering_of_the_committed_reports():
    assert update_readme(PAGE, ROOT / "docs", check=True) == []


def test_readme_claims_equal_claims_json():
    blocks = readme_blocks(PAGE.read_text(encoding="utf-8"))
    claims = json.loads((ROOT / "docs" / "demo" / "claims.json").read_text())
    found = re.findall(NUM, blocks["seed0-claims"])
    assert found == [(_pp(c["diff"]), _pp(c["ci"][0]), _pp(c["ci"][1])) for c in claims]
    if (ROOT / "docs" / "demo_seeds" / "summary.json").is_file():
        summary = json.loads((ROOT / "docs" / "demo_seeds" / "summary.json").read_text())
        expect = [(_pp(c["diff"]), _pp(c["ci"][0]), _pp(c["ci"][1]))
                  for e in summary["per_seed"].values() for c in e["claims"]]
        expect += [(_pp(c["diff"]), _pp(c["ci"][0]), _pp(c["ci"][1])) for c in summary["claims"]]
        # then the per-question-type pools, a row per type, a column per claim
        types = sorted({d for c in summary["claims"] for d in c.get("per_dataset", {})})
        expect += [(_pp(e["diff"]), _pp(e["ci"][0]), _pp(e["ci"][1])) for d in types
                   for c in summary["claims"] if (e := c.get("per_dataset", {}).get(d))]
    else:
        expect = []
        for d in sorted((ROOT / "docs").glob("demo_seed[0-9]*"), key=lambda p: int(p.name[9:])):
            expect += [(_pp(c["diff"]), _pp(c["ci"][0]), _pp(c["ci"][1]))
                       for c in json.loads((d / "claims.json").read_text())]
    assert re.findall(NUM, blocks["seeds"]) == expect


def test_readme_system_table_equals_the_report():
    blocks = readme_blocks(PAGE.read_text(encoding="utf-8"))
    report = main_table_rows((ROOT / "docs" / "demo" / "report.md").read_text(encoding="utf-8"))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in blocks["seed0-systems"].splitlines()[2:]]
    assert [r[1:] for r in rows] == [r[1:4] for r in report]
    assert [r[0].split(" (")[0] for r in rows] == [r[0] for r in report]


def _fake_run(d: Path, seed_shift: float = 0.0):
    (d / "report").mkdir(parents=True)
    (d / "report" / "report.md").write_text(
        "# t\n\n## Main results (strict EM, macro)\n\n| System | avg@4 | pass@4 | 4/4 |\n| :--- | ---: | ---: | ---: |\n"
        "| C-MAS base | 1.00 [0.00, 2.00] | 3.00 [2.00, 4.00] | 0.00 [0.00, 0.00] |\n"
        "| MultiAgent-OPD | 9.00 [8.00, 10.00] | 9.50 [9.00, 10.00] | 1.00 [0.00, 2.00] |\n\n### next\n")
    qs = [{"dataset": "a" if i % 2 else "b", "id": f"q{i}", "base": 0.0, "trained": 0.1 + seed_shift} for i in range(6)]
    claims = [{"trained": t, "base": b, "metric": "avg@4", "diff": 0.1 + seed_shift, "ci": [0.05, 0.15],
               "holds": True, "questions": qs} for t, b in (("C-MAS + RL", "C-MAS base"), ("MultiAgent-OPD", "H-MAS base"))]
    (d / "report" / "claims.json").write_text(json.dumps(claims))
    (d / "report" / "per_dataset.png").write_bytes(b"png")
    (d / "timings.json").write_text(json.dumps({"world": 10.0, "pi0": 300.0, "stage1": 290.0, "stage2": 310.0,
                                                "eval": 70.0, "total": 990.0}))
    (d / "world").mkdir()
    (d / "world" / "big.bin").write_bytes(b"x")


README = ("intro\n<!-- demo-tables:seed0-systems -->\nold\n<!-- /demo-tables:seed0-systems -->\nmid\n"
          "<!-- demo-tables:seed0-claims -->\n<!-- /demo-tables:seed0-claims -->\n"
          "<!-- demo-tables:seed0-timings -->\nx\n<!-- /demo-tables:seed0-timings -->\n"
          "<!-- demo-tables:lora-systems -->\n<!-- /demo-tables:lora-systems -->\n"
          "<!-- demo-tables:lora-claims -->\n<!-- /demo-tables:lora-claims -->\n"
          "<!-- demo-tables:lora-timings -->\n<!-- /demo-tables:lora-timings -->\n"
          "<!-- demo-tables:seeds -->\n<!-- /demo-tables:seeds -->\nend\n")


def test_publish_then_render_into_a_readme(tmp_path):
    from mopd.recipes.tiny_world.report import write_seed_summary

    _fake_run(tmp_path / "runs" / "demo")
    docs = tmp_path / "docs"
    publish(tmp_path / "runs" / "demo", docs / "demo")
    assert sorted(p.name for p in (docs / "demo").iterdir()) == ["claims.json", "per_dataset.png", "report.md",
                                                                 "timings.json"]
    # a run also evaluated on dev (the tuning path) publishes that report under dev/, and renders from test
    dev = tmp_path / "runs" / "demo" / "report_dev"
    dev.mkdir()
    (dev / "report.md").write_text("dev report")
    (dev / "claims.json").write_text("[]")
    publish(tmp_path / "runs" / "demo", docs / "demo")
    assert sorted(p.name for p in (docs / "demo" / "dev").iterdir()) == ["claims.json", "report.md"]
    assert (docs / "demo" / "dev" / "report.md").read_text() == "dev report"
    assert (docs / "demo" / "report.md").read_text() != "dev report"
    for n, shift in ((3, 0.0), (4, 0.1)):
        _fake_run(tmp_path / "runs" / "seeds" / f"seed{n}", shift)
    write_seed_summary(tmp_path / "runs" / "seeds", [3, 4], draws=100)
    publish(tmp_path / "runs" / "seeds", docs / "demo_seeds")
    assert (docs / "demo_seeds" / "seed4" / "claims.json").is_file() and (docs / "demo_seeds" / "summary.md").is_file()
    readme = docs / "demo.md"
    readme.write_text(README)
    assert update_readme(readme, docs) == ["seed0-systems", "seed0-claims", "seed0-timings", "lora-systems",
                                           "lora-claims", "lora-timings", "seeds"]
    assert readme.read_text().count("No LoRA run is published yet") == 3
    # the LoRA variant's run, published beside the full one, renders into its own blocks
    _fake_run(tmp_path / "runs" / "demo_lora", 0.5)
    lora_md = tmp_path / "runs" / "demo_lora" / "report" / "report.md"
    lora_md.write_text(lora_md.read_text() + "Differ most; the links open `view.html` beside this report, written by "
                       "`mopd view`:\n| a | [q-1](view.html#q=a/q-1) (-100), [q-2](view.html#q=a/q-2) (+75) |\n")
    publish(tmp_path / "runs" / "demo_lora", docs / "demo_lora")
    published = (docs / "demo_lora" / "report.md").read_text()
    assert "view.html#" not in published and "| a | q-1 (-100), q-2 (+75) |" in published
    assert "links each to `view.html` beside it (not kept in this published copy), written by `mopd view`" in published
    assert update_readme(readme, docs) == ["lora-systems", "lora-claims", "lora-timings"]
    text = readme.read_text()
    assert "No LoRA run" not in text and text.count("16.5 min in all") == 2 and "**+60.00 [+5.00, +15.00]**" in text
    assert text.startswith("intro\n") and "\nmid\n" in text and text.endswith("end\n") and "\nold\n" not in text
    assert "| MultiAgent-OPD (Stage II) | 9.00 [8.00, 10.00] | 9.50 [9.00, 10.00] | 1.00 [0.00, 2.00] |" in text
    assert "**+10.00 [+5.00, +15.00]**" in text and "16.5 min in all" in text
    assert "| C-MAS + RL minus C-MAS base | 2 of 2 seeds | +15.00 [+10.00, +20.00] |" in text
    assert "[seed 4](demo_seeds/seed4/report.md)" in text
    assert update_readme(readme, docs, check=True) == []
    # a report that changes makes the page out of date, and check does not write
    claims = json.loads((docs / "demo" / "claims.json").read_text())
    claims[0]["diff"] = 0.2
    (docs / "demo" / "claims.json").write_text(json.dumps(claims))
    assert update_readme(readme, docs, check=True) == ["seed0-claims"] and readme.read_text() == text
    assert set(render_blocks(docs)) == set(readme_blocks(text))


def test_readme_without_markers_is_refused(tmp_path):
    (tmp_path / "R.md").write_text("no markers\n")
    with pytest.raises(ValueError, match="no markers"):
        update_readme(tmp_path / "R.md", ROOT / "docs")


def test_render_new_claims_systems_and_seeds_from_a_fabricated_docs_folder(tmp_path):
    """A run with the control arm: the seed-0 claims block lists every claim in order with kind and
    verdict (a failing headline included), the systems block names the control, and the seeds
    block has a column per claim and the Leader's 2+-subtask rate."""
    from mopd.recipes.tiny_world.report import write_seed_summary

    def claims(shift):
        qs = [{"dataset": "tiny_pair_towns" if i % 2 else "tiny_2hop", "id": f"q{i}", "base": 0.5, "trained": 0.5 + shift}
              for i in range(5)]
        spec = [("primary", "MultiAgent-OPD", "No Searcher supervision", 0.03 + shift, [0.01 + shift, 0.05 + shift]),
                ("headline", "MultiAgent-OPD", "C-MAS + RL", -0.02, [-0.06, 0.02]),
                ("check", "C-MAS + RL", "C-MAS base", 0.3, [0.25, 0.35]),
                ("check", "MultiAgent-OPD", "H-MAS base", 0.25, [0.2, 0.3])]
        return [{"kind": k, "label": "x", "trained": t, "base": b, "metric": "avg@4", "diff": d, "ci": ci,
                 "holds": ci[0] > 0, "verdict": "above" if ci[0] > 0 else "indistinguishable",
                 "questions": [dict(q, trained=q["base"] + d) for q in qs]} for k, t, b, d, ci in spec]

    runs = tmp_path / "runs"
    for n, shift in ((1, 0.0), (2, -0.04)):
        _fake_run(runs / f"seed{n}", shift)
        (runs / f"seed{n}" / "report" / "claims.json").write_text(json.dumps(claims(shift)))
        act = {"MultiAgent-OPD": {"per_dataset": {"tiny_pair_towns": {"multi_subtask": 0.75 + shift,
                                                                   "multi_subtask_one_wave": 0.5}}}}
        (runs / f"seed{n}" / "report" / "metrics.json").write_text(json.dumps({"activity": act}))
    write_seed_summary(runs, [1, 2], draws=100)
    docs = tmp_path / "docs"
    publish(runs / "seed1", docs / "demo")
    (docs / "demo" / "report.md").write_text(
        "# t\n\n## Claims\n\n| # | kind |\n|---|---|\n| 1 | primary |\n\n## Main results (strict EM, macro)\n\n"
        "| System | avg@4 | pass@4 | 4/4 |\n| :--- | ---: | ---: | ---: |\n"
        "| MultiAgent-OPD | 9.00 [8.00, 10.00] | 9.50 [9.00, 10.00] | 1.00 [0.00, 2.00] |\n"
        "| No Searcher supervision | 7.00 [6.00, 8.00] | 8.50 [8.00, 9.00] | 0.00 [0.00, 0.00] |\n"
        "| Some other system | 1.00 [0.00, 2.00] | 1.00 [0.00, 2.00] | 0.00 [0.00, 0.00] |\n\n### next\n")
    publish(runs, docs / "demo_seeds")
    blocks = render_blocks(docs)
    assert blocks["seed0-systems"].splitlines()[2:] == [
        "| MultiAgent-OPD (Stage II) | 9.00 [8.00, 10.00] | 9.50 [9.00, 10.00] | 1.00 [0.00, 2.00] |",
        "| No Searcher supervision (Stage II, Searcher loss 0) | 7.00 [6.00, 8.00] | 8.50 [8.00, 9.00] | 0.00 [0.00, 0.00] |"]
    rows = blocks["seed0-claims"].splitlines()
    assert rows[0] == "| # | kind | claim | difference [95% interval] | verdict |"
    assert rows[2:] == [
        "| 1 | primary | MultiAgent-OPD minus No Searcher supervision: x | **+3.00 [+1.00, +5.00]** | above 0 (holds) |",
        "| 2 | headline | MultiAgent-OPD minus C-MAS + RL: x | **-2.00 [-6.00, +2.00]** | not distinguishable from 0 |",
        "| 3 | check | C-MAS + RL minus C-MAS base: x | **+30.00 [+25.00, +35.00]** | above 0 (holds) |",
        "| 4 | check | MultiAgent-OPD minus H-MAS base: x | **+25.00 [+20.00, +30.00]** | above 0 (holds) |"]
    seeds = blocks["seeds"].splitlines()
    assert seeds[0].startswith("| seed | primary: MultiAgent-OPD minus No Searcher supervision | headline: ")
    assert ("| 2 | -1.00 [-3.00, +1.00] (not distinguishable from 0) | -2.00 [-6.00, +2.00] (not distinguishable "
            "from 0) | +30.00 [+25.00, +35.00] | +25.00 [+20.00, +30.00] | 71.0% (50.0% in one output) |") in seeds[3]
    assert "| primary | MultiAgent-OPD minus No Searcher supervision | 1 of 2 seeds | +1.00 [" in blocks["seeds"]
    readme = docs / "demo.md"
    readme.write_text(README)
    update_readme(readme, docs)
    assert update_readme(readme, docs, check=True) == []


def test_seeds_block_from_single_seed_folders_takes_every_claim(tmp_path):
    """Without a multi-seed summary, one row per docs/demo_seedN folder, a column per claim any of
    them has in the claims' order (n/a where one lacks it)."""
    docs = tmp_path / "docs"
    for n, extra in ((1, False), (2, True)):
        d = docs / f"demo_seed{n}"
        d.mkdir(parents=True)
        cl = [{"trained": "C-MAS + RL", "base": "C-MAS base", "metric": "avg@4", "diff": 0.3, "ci": [0.2, 0.4],
               "holds": True}]
        if extra:
            cl.insert(0, {"trained": "MultiAgent-OPD", "base": "C-MAS + RL", "metric": "avg@4", "diff": -0.1,
                          "ci": [-0.2, -0.05], "holds": False})
        (d / "claims.json").write_text(json.dumps(cl))
        (d / "timings.json").write_text(json.dumps({"total": 600.0}))
    from mopd.recipes.tiny_world.tables import render_seeds

    lines = render_seeds(docs).splitlines()
    assert lines[0] == "| seed | MultiAgent-OPD minus C-MAS + RL | C-MAS + RL minus C-MAS base | demo time | report |"
    assert lines[2] == "| 1 | n/a | +30.00 [+20.00, +40.00] | 10.0 min | [seed 1](demo_seed1/report.md) |"
    assert lines[3] == ("| 2 | -10.00 [-20.00, -5.00] (below 0) | +30.00 [+20.00, +40.00] | 10.0 min | "
                        "[seed 2](demo_seed2/report.md) |")


def test_seeds_block_says_when_no_seed_is_published(tmp_path):
    from mopd.recipes.tiny_world.tables import render_seeds

    assert "No untuned seed" in render_seeds(tmp_path)
