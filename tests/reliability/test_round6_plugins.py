"""Third-party recipes are plug-ins, and one bad plug-in never takes the tool down (mopd.core.recipes):
a recipe that exits, raises a BaseException, prints, blocks at import, or whose preset raises when
built costs one line naming it; the core's commands never import a recipe at all.

Each probe runs ``mopd`` in a fresh interpreter with one more folder of recipes (as a user's
entry-point recipe would be found), since a process imports its recipes once."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import yaml

from tests.reliability.runs import step_dir, write_run

ROOT = Path(__file__).resolve().parents[2]

# mopd's command line in a fresh interpreter with argv[1] as one more recipe folder: each later
# argument is one command (a JSON list of words), named in the environment (PROBE_COMMAND) while it
# runs; after each, its exit code is printed on stderr as "<rc N>" and "<end>" on stdout.
_DRIVER = textwrap.dedent("""\
    import importlib, json, os, sys
    from mopd.core.recipes import PACKAGE
    importlib.import_module(PACKAGE).__path__.append(sys.argv[1])
    from mopd.cli import main
    for command in sys.argv[2:]:
        os.environ["PROBE_COMMAND"] = command
        try:
            rc = main(json.loads(command))
        except SystemExit as e:
            rc = e.code
        print("<end>", flush=True)
        print(f"<rc {rc}>", file=sys.stderr, flush=True)
    """)


def _mopd(folder, *commands, env=None, timeout=120):
    """Run each of ``commands`` (lists of words) in one fresh process; (their exit codes, their
    stdouts, the stderr lines that are not the driver's)."""
    out = subprocess.run([sys.executable, "-c", _DRIVER, str(folder), *(json.dumps(c) for c in commands)],
                         capture_output=True, text=True, timeout=timeout, cwd=folder,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    codes = [int(line[4:-1]) for line in out.stderr.splitlines() if line.startswith("<rc ")]
    lines = [line for line in out.stderr.splitlines() if not line.startswith("<rc ")]
    outs = out.stdout.split("<end>\n")
    assert len(outs) == len(commands) + 1 and outs[-1] == "", out.stdout[-3000:]
    return codes, outs[:-1], lines


def _listed(out: str) -> list:
    """The preset names that ``mopd config list`` printed."""
    return [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")]


def _recipe(folder: Path, name: str, body: str, commands: str = "") -> str:
    pkg = folder / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    if commands:
        (pkg / "commands.py").write_text(textwrap.dedent(commands))
    return f"mopd.recipes.{name}"


_BASE_EXCEPTIONS = {
    "sys.exit": "import sys\nsys.exit(3)\n",
    "SystemExit with text": "raise SystemExit('this recipe needs a GPU')\n",
    "KeyboardInterrupt": "raise KeyboardInterrupt\n",
    "GeneratorExit": "raise GeneratorExit\n",
}


@pytest.mark.parametrize("exit_body", list(_BASE_EXCEPTIONS), ids=list(_BASE_EXCEPTIONS))
def test_a_recipe_that_exits_or_raises_any_base_exception_at_import_is_one_warning_line(tmp_path, exit_body):
    body = ("from mopd.config import register_preset\n\n@register_preset\ndef r_exiting():\n    return None\n\n"
            + _BASE_EXCEPTIONS[exit_body])
    name = _recipe(tmp_path, "r_exits", body)
    # the core's commands, --help and --version never import it; a recipe's own preset (tiny_cmas_rl)
    # needs the recipes: the bad one is imported there, and skipped
    codes, out, err = _mopd(tmp_path, ["--help"], ["config", "show", "cmas_rl"], ["--version"],
                            ["config", "show", "tiny_cmas_rl"], ["config", "list"], ["config", "show", "r_exiting"])
    assert codes == [0, 0, 0, 0, 0, 2], err
    assert "config" in out[0] and "demo" in out[0] and "algo:" in out[1] and out[2].startswith("mopd ")
    assert "algo:" in out[3] and out[5] == ""
    listed = _listed(out[4])
    assert "cmas_rl" in listed and "tiny_cmas_rl" in listed and "r_exiting" not in listed   # taken out whole
    assert len(err) == 2 and err[0].startswith(f"mopd: warning: recipe {name} failed to load and is skipped: "), err
    assert "unknown preset 'r_exiting'" in err[1] and f"recipe {name} failed to load" in err[1]


def test_a_ctrl_c_of_the_users_while_recipes_load_still_interrupts(tmp_path):
    """A KeyboardInterrupt that the recipe raises is its failure; a real SIGINT is the user's."""
    _recipe(tmp_path, "r_ctrl_c", "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\n")
    codes, out, err = _mopd(tmp_path, ["config", "show", "tiny_cmas_rl"])   # recipes read by a handler
    assert codes == [130] and err == ["mopd config: interrupted"] and out == [""]
    codes, out, err = _mopd(tmp_path, ["demo", "--help"])   # recipes read to build the command line
    assert codes == [130] and err == ["mopd: interrupted"] and out == [""]


def test_what_a_recipe_prints_at_import_never_reaches_machine_readable_output(tmp_path):
    name = _recipe(tmp_path, "r_chatty", """\
        import os, sys
        print("r_chatty: hello from the recipe")
        sys.stdout.write("r_chatty: not yaml: [\\n")
        os.write(1, b"r_chatty: straight to file descriptor 1\\n")
        """, commands="""\
        import json
        print("r_chatty.commands: importing")

        def register(sub):
            print("r_chatty.commands: registering")
            p = sub.add_parser("r-chatty-json", help="print one JSON object")
            p.set_defaults(func=lambda args: print(json.dumps({"answer": 42})))
        """)
    codes, (out,), err = _mopd(tmp_path, ["config", "show", "tiny_cmas_rl"])
    assert codes == [0]
    shown = yaml.safe_load(out.split("---\n", 1)[1])   # the YAML part parses: nothing but the config
    assert shown["trainer"]["steps"] > 0 and "r_chatty" not in out
    assert [line for line in err if "r_chatty" in line] == [
        "r_chatty: hello from the recipe", "r_chatty: not yaml: [", "r_chatty: straight to file descriptor 1"]
    codes, (out,), err = _mopd(tmp_path, ["r-chatty-json"])
    assert codes == [0] and json.loads(out) == {"answer": 42}, (out, err)
    assert "r_chatty.commands: importing" in err and "r_chatty.commands: registering" in err
    assert name not in "\n".join(err)   # it loaded: no warning


_BLOCKS = "import threading\nthreading.Event().wait()   # forever\n"


def test_a_recipe_that_blocks_at_import_is_skipped_after_the_bound_naming_it(tmp_path):
    name = _recipe(tmp_path, "r_blocks", "from mopd.config import register_preset\n\n@register_preset\n"
                                         "def r_blocked():\n    return None\n\n" + _BLOCKS)
    codes, out, err = _mopd(tmp_path, ["config", "show", "tiny_cmas_rl"], ["config", "list"],
                            env={"MOPD_RECIPE_IMPORT_TIMEOUT": "1.5"}, timeout=100)
    assert codes == [0, 0], err
    assert err == [f"mopd: warning: recipe {name} failed to load and is skipped: its import took longer than "
                   "1.5 s (the bound that MOPD_RECIPE_IMPORT_TIMEOUT sets; 0: none)"]
    listed = _listed(out[1])
    assert listed[0] == "cmas_rl" and "tiny_mopd" in listed and "r_blocked" not in listed
    # a recipe's command whose module blocks: named the same way, the other commands stay
    _recipe(tmp_path / "second", "r_slow_commands", "", commands=_BLOCKS + "def register(sub):\n    pass\n")
    codes, (out,), err = _mopd(tmp_path / "second", ["demo", "--help"], env={"MOPD_RECIPE_IMPORT_TIMEOUT": "1.5"})
    assert codes == [0] and "--quick" in out
    assert err == ["mopd: warning: mopd.recipes.r_slow_commands.commands failed to load and is skipped: its import "
                   "took longer than 1.5 s (the bound that MOPD_RECIPE_IMPORT_TIMEOUT sets; 0: none)"]


def _records_file(path: Path) -> Path:
    from mopd.core.records import write_records
    from tests.helpers.records import call, record

    rec = record("q1", answers=("Paris",), candidates=("<answer>Paris</answer>",),
                 calls=[call("a0", "answerer", ["<answer>Paris</answer>"])])
    write_records(path, [rec])
    return path


def _marker_recipe(folder: Path) -> Path:
    """A recipe that appends the command running (PROBE_COMMAND) to a file whenever it is imported."""
    marker = folder / "imported.txt"
    _recipe(folder, "r_marker", f"import os\nwith open({str(marker)!r}, 'a') as f:\n"
                                f"    f.write(os.environ.get('PROBE_COMMAND', '?') + '\\n')\n")
    return marker


def test_help_version_config_and_plan_never_import_a_recipe(tmp_path):
    marker = _marker_recipe(tmp_path)
    commands = [["--version"], ["--help"], ["config", "show", "cmas_rl"], ["config", "show", "mopd"],
                ["plan", "--gpus", "8", "--gpu-gib", "80", "mopd", "model.path=Qwen/Qwen3-4B-Instruct-2507"]]
    codes, out, err = _mopd(tmp_path, *commands)
    assert codes == [0] * len(commands), err
    assert not marker.exists(), marker.read_text()
    assert "demo" in out[1]   # --help lists the recipes' commands, read from their source
    codes, out, err = _mopd(tmp_path, ["config", "show", "tiny_cmas_rl"])   # a recipe's preset: it is imported
    assert codes == [0] and marker.read_text() == json.dumps(["config", "show", "tiny_cmas_rl"]) + "\n"


@pytest.mark.slow   # a checkpoint, an export and a pipeline's dry run in a fresh process: ~25 s on a loaded machine
def test_view_export_and_a_pipeline_dry_run_never_import_a_recipe(tmp_path, tiny_model_dir):
    marker = _marker_recipe(tmp_path)
    run = tmp_path / "run"
    write_run(run, tiny_model_dir, steps=(1,))
    records = _records_file(tmp_path / "records.jsonl")
    commands = [["pipeline", "paper", "--dry-run"], ["view", str(records), "--out", str(tmp_path / "page")],
                ["export", str(step_dir(run, 1)), "--out", str(tmp_path / "export")]]
    codes, out, err = _mopd(tmp_path, *commands)
    assert codes == [0] * len(commands), err
    assert not marker.exists(), marker.read_text()
    assert (tmp_path / "export" / "config.json").is_file()


def test_retriever_serve_never_imports_a_recipe(tmp_path):
    from tests.reliability.indexes import bm25_index

    index = bm25_index(tmp_path / "idx")
    _recipe(tmp_path, "r_blocking", _BLOCKS)
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(tmp_path),
                             json.dumps(["retriever", "serve", "--index", str(index), "--port", "0"])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "MOPD_RECIPE_IMPORT_TIMEOUT": "0"})
    lines = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    try:
        reader.join(timeout=90)   # the recipe blocks forever if imported (no bound here): no line comes
        assert lines and lines[0].startswith("serving "), proc.stderr.read() if proc.poll() is not None else lines
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        finally:
            proc.kill()


def test_a_recipe_preset_that_raises_when_built_is_one_line_naming_it_and_its_recipe(tmp_path):
    name = _recipe(tmp_path, "r_bad_presets", """\
        from mopd.config import register_preset
        from mopd.pipeline.presets import pipeline_preset

        @register_preset
        def r_broken_preset():
            raise RuntimeError("no such model\\n on this machine")

        @register_preset
        def r_exiting_preset():
            import sys
            sys.exit(4)

        @pipeline_preset
        def r_broken_pipeline():
            return {}["missing"]
        """)
    codes, out, err = _mopd(tmp_path, ["config", "show", "r_broken_preset"], ["config", "show", "r_exiting_preset"],
                            ["pipeline", "r_broken_pipeline", "--dry-run"],
                            ["train", "r_broken_preset", "trainer.out_dir=run"])
    assert codes == [2, 2, 2, 2], err
    assert err == [
        f"mopd config: error: preset 'r_broken_preset' (recipe {name}) failed to build: RuntimeError: no such "
        "model on this machine",
        f"mopd config: error: preset 'r_exiting_preset' (recipe {name}) failed to build: SystemExit: 4",
        f"mopd pipeline: error: pipeline 'r_broken_pipeline' (recipe {name}) failed to build: KeyError: 'missing'",
        f"mopd train: error: preset 'r_broken_preset' (recipe {name}) failed to build: RuntimeError: no such "
        "model on this machine"]
    assert not (tmp_path / "run").exists()
