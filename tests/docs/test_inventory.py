"""Every command of the docs is run by a test, or its page says why not: the inventory of the tier
(``pytest -s tests/docs/test_inventory.py`` prints it)."""

from __future__ import annotations

import pytest

from tests.docs.commands import MarkerError, all_commands, page_commands
from tests.docs.runner import SUBSTITUTIONS, as_run
from tests.docs.sequences import SEQUENCES, Part, command_key, covered_elsewhere, in_part, sequence


def inventory(commands):
    """(command, status) for every documented command: "run by <sequence>", "run by <other test>",
    "the same as <where>" or "marker: <reason>"."""
    run_by = {}
    for name in SEQUENCES:
        for cmd in sequence(name, commands):
            run_by.setdefault(cmd.where, name)
    keys = {command_key(c): c.where for c in commands if c.where in run_by}
    rows = []
    for cmd in commands:
        if cmd.skip is not None:
            rows.append((cmd, f"marker: {cmd.skip}"))
        elif cmd.where in run_by:
            rows.append((cmd, f"run by tests/docs sequence {run_by[cmd.where]!r}"))
        elif covered_elsewhere(cmd):
            rows.append((cmd, f"run by {covered_elsewhere(cmd)}"))
        elif command_key(cmd) in keys:
            rows.append((cmd, f"the same command as {keys[command_key(cmd)]}"))
        else:
            rows.append((cmd, "NOT RUN and not marked"))
    return rows


def test_every_documented_command_is_run_or_marked_with_why():
    commands = all_commands()
    rows = inventory(commands)
    for cmd, status in rows:
        print(f"{cmd.where:28} {status:60} {cmd.text.splitlines()[0][:90]}")
    markers = [c for c, s in rows if s.startswith("marker")]
    tier = sum(s.startswith("run by tests/docs") for _, s in rows)
    print(f"{len(rows)} commands: {tier} run by tests/docs, {len(rows) - len(markers) - tier} by other tests or "
          f"as the same command, {len(markers)} marked as not runnable here")
    missing = [f"{c.where}: {c.text.splitlines()[0]}" for c, s in rows if s.startswith("NOT RUN")]
    assert not missing, ("documented commands no test runs: run them in a tests/docs sequence, or mark them in "
                         "the page (an HTML comment `<!-- doc-test:` before the block, a line "
                         "`COMMAND PREFIX => why`)", missing)
    assert len(rows) - len(markers) >= 25   # the tier runs most of them


def test_every_sequence_part_names_a_section_with_commands_to_run():
    commands = all_commands()
    for name, parts in SEQUENCES.items():
        for part in parts:
            found = [c for c in commands if in_part(c, part)]
            assert found, f"sequence {name!r}: {part} matches no unmarked command (a heading renamed?)"
            for prefix in part.only:
                assert any(c.text.startswith(prefix) for c in found), (name, part, prefix)


def test_substitutions_change_only_what_the_table_says(tmp_path):
    ran = as_run("torchrun --nproc_per_node 8 -m mopd train cmas_rl model.path=Qwen/Qwen3-4B-Instruct-2507 ...",
                 tmp_path, 4321)
    assert ran.startswith("torchrun --nproc_per_node 1 -m mopd train cmas_rl model.path=Qwen/Qwen3-4B-Instruct-2507 "
                          f"data.train={tmp_path}/qa.jsonl")
    assert "trainer.steps=2" in ran and "..." not in ran
    assert as_run("mopd train --resume x ...", tmp_path, 1) == as_run("mopd train x ...", tmp_path, 1).replace(
        "train x", "train --resume x")   # a resume: the run's own arguments
    assert as_run("mopd eval run --model m ...", tmp_path, 1).endswith("retriever.index=bundled rollout.engine=hf "
                                                                       "rollout.max_output_tokens=8 rollout.max_steps=2 "
                                                                       "rollout.max_rounds=1")
    assert as_run("mopd pipeline paper --dry-run", tmp_path, 1) == "mopd pipeline paper --dry-run"
    assert as_run("mopd pipeline paper   # again", tmp_path, 1).startswith(
        f"mopd pipeline paper --file {tmp_path}/tiny_paper.yaml")
    assert as_run("x --port 8000 retriever.url=http://127.0.0.1:8000", tmp_path, 77) == \
        "x --port 77 retriever.url=http://127.0.0.1:77"
    assert as_run("mopd config show mopd --trainer.lr 2e-6", tmp_path, 1) == "mopd config show mopd --trainer.lr 2e-6"
    assert as_run("mopd view runs/demo/eval/a runs/demo/eval/b --teacher runs/demo/stage1/export", tmp_path, 1) == \
        "mopd view runs/demo_quick/eval/a runs/demo_quick/eval/b --teacher runs/demo_quick/stage1/export"
    assert as_run("mopd view EVAL_DIR --x", tmp_path, 1) == "mopd view runs/demo_quick/eval/multiagent_opd --x"
    assert as_run("mopd view records.jsonl --serve", tmp_path, 1) == \
        "mopd view runs/demo_quick/eval/multiagent_opd/records.jsonl --serve"
    assert len(SUBSTITUTIONS) <= 14   # a small table


def test_markers_are_read_per_command_and_a_stale_one_is_an_error(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# T\n\n<!-- doc-test: why not\nmopd slow => over 10 minutes\n-->\n```bash\n"
                    "# a comment\nmopd fast --x \\\n    --y   # trailing\nmopd slow --z\n```\n\n"
                    "```python\nprint(1)\n```\n")
    cmds = page_commands("p.md", tmp_path)
    assert [(c.line, c.text, c.skip) for c in cmds] == [
        (8, "mopd fast --x --y   # trailing", None), (10, "mopd slow --z", "over 10 minutes")]
    assert command_key(cmds[0]) == "mopd fast --x --y"
    page.write_text("<!-- doc-test:\nmopd gone => moved\n-->\n```bash\nmopd here\n```\n")
    with pytest.raises(MarkerError, match="names no command of its block"):
        page_commands("p.md", tmp_path)
    page.write_text("<!-- doc-test:\nmopd here needs a GPU\n-->\n```bash\nmopd here\n```\n")
    with pytest.raises(MarkerError, match="PREFIX => REASON"):
        page_commands("p.md", tmp_path)
    page.write_text("<!-- doc-test:\nmopd here => x\n-->\ntext\n```bash\nmopd here\n```\n")
    with pytest.raises(MarkerError, match="right before a fenced block"):
        page_commands("p.md", tmp_path)


def test_a_command_no_test_runs_is_reported(tmp_path):
    from tests.docs.commands import DocCommand
    orphan = DocCommand("docs/x.md", "Nowhere", 3, "bash", "mopd new-command", None)
    assert inventory([orphan]) == [(orphan, "NOT RUN and not marked")]
    assert not in_part(orphan, Part("docs/x.md", "Nowhere", only=("mopd other",)))
