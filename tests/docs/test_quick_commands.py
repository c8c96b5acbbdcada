"""The documented commands that load no model, run as written through the `mopd` a user types (a few
seconds each: the default suite), and the kernels README's first snippet in a fresh interpreter."""

from __future__ import annotations

import re

from tests.docs.sequences import sequence


def test_the_docs_quick_commands_run_as_written(doc_shell):
    outputs = {}
    commands = sequence("quick")
    assert len(commands) >= 6
    for cmd in commands:
        outputs[cmd.text.split("  #")[0].strip()] = doc_shell.run(cmd, timeout=300)
    # what a reader is told each one prints
    assert "tiny_cmas_rl" in outputs["mopd config list"] and "prompted_critic" in outputs["mopd config list"]
    shown = outputs["mopd config show mopd --trainer.lr 2e-6 rollout.group_size=8"]
    assert re.search(r"^  lr: 2\.0e-06$", shown, re.M) and re.search(r"^  group_size: 8$", shown, re.M)
    from_file = outputs["mopd config show --file my_run.yaml mopd teacher.path=runs/stage1/export"]
    assert re.search(r"^  lr: 3\.0e-06$", from_file, re.M) and re.search(r"^  steps: 7$", from_file, re.M)
    assert re.search(r"^  path: runs/stage1/export$", from_file, re.M)
    plan = next(v for k, v in outputs.items() if k.startswith("mopd plan"))
    assert plan.rstrip().endswith("FITS")
    assert "pipeline paper: " in outputs["mopd pipeline paper --dry-run"]
    assert "(dry run: nothing was loaded or run)" in outputs[".venv/bin/mopd pipeline demo --dry-run"]
    assert not (doc_shell.cwd / "runs").exists()   # a dry run writes nothing


def test_the_kernels_readmes_first_snippet_runs_in_a_fresh_interpreter(doc_shell):
    (cmd,) = sequence("kernels_snippets")
    out = doc_shell.run(cmd, timeout=300)
    loss, stats = out.strip().splitlines()[-1].split(" ", 1)
    assert float(loss) == float(loss)   # a number, not nan
    for name in ("clip_low_frac", "kl", "entropy_mean"):
        assert f"'{name}'" in stats
