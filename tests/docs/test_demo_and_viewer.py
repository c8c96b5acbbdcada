"""The README's demo smoke run, then docs/viewer.md's and docs/demo.md's `mopd view` commands on
what it wrote (runs/demo_quick, for the full demo's runs/demo), the page served on a port and
fetched, in one working directory."""

from __future__ import annotations

import json

import pytest

from tests.docs.runner import DocShell
from tests.docs.sequences import sequence

pytestmark = pytest.mark.slow


def test_the_demo_smoke_run_then_every_viewer_command_on_it(tiny_assets, tmp_path):
    shell = DocShell(tmp_path / "work", tiny_assets)
    try:
        commands = sequence("demo")
        assert commands[0].text.startswith(".venv/bin/mopd demo --quick")
        served = False
        for cmd in commands:
            out = shell.run(cmd)
            if " --serve" in cmd.text:
                page = shell.get("/view.html").decode()
                records = shell.cwd / "runs" / "demo_quick" / "eval" / "multiagent_opd" / "records.jsonl"
                first = json.loads(records.read_text().splitlines()[0])
                assert page.lstrip().lower().startswith("<!doctype html") and first["question_id"] in page
                shell.stop_servers()
                served = True
            elif cmd.text.startswith("mopd view"):
                assert "wrote" in out.lower() or ".html" in out, out[-500:]
        assert served
        demo = shell.cwd / "runs" / "demo_quick"
        assert (demo / "report" / "report.md").exists()
        assert (demo / "eval" / "multiagent_opd" / "view.html").exists()
        assert (demo / "report" / "view.html").exists()
        assert (shell.cwd / "viewer_seed0.html").exists()
    finally:
        shell.stop_servers()
