"""Running the docs' commands as a user types them, in a temporary directory: through ``bash``, with
``.venv/bin`` first on PATH (so ``mopd``, ``torchrun`` and ``.venv/bin/mopd`` are this checkout's),
offline, with a private Hugging Face cache in which the docs' Hub model id is a tiny random model.

What differs from the page is declared once, in SUBSTITUTIONS below (and the files a sequence finds
in its directory, in ``tiny_assets``); nothing of it is edited into the docs."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.docs.commands import ROOT, DocCommand

HUB_MODEL = "Qwen/Qwen3-4B-Instruct-2507"

# a tiny run's settings, for the `...` the docs write for "the paper's other settings": the tier's
# QA file, the bundled corpus served in-process, the HF engine, 2 steps of 2 questions
TINY_RUN = ("data.train={assets}/qa.jsonl data.dev={assets}/qa.jsonl retriever.kind=inprocess retriever.index=bundled "
            "rollout.engine=hf trainer.steps=2 trainer.questions_per_step=2 rollout.group_size=2 "
            "rollout.answer_candidates=2 rollout.max_output_tokens=8 rollout.max_steps=2 rollout.max_rounds=1 "
            "trainer.micro_batch_tokens=600 trainer.val_every=1 trainer.val_attempts=1 data.dev_size=2 "
            "trainer.checkpoint_every=1 trainer.max_signalless_steps=0 trainer.cpu_threads=1")

TINY_EVAL = ("eval.attempts=1 retriever.kind=inprocess retriever.index=bundled rollout.engine=hf "
             "rollout.max_output_tokens=8 rollout.max_steps=2 rollout.max_rounds=1")


@dataclass(frozen=True)
class Substitution:
    pattern: str       # a regular expression over the command's text
    replacement: str   # its replacement ({assets}, {port}: the sequence's tiny assets and server port)
    why: str
    only_in: str = ""  # a regular expression the command must match for this row to apply


# The one table of what the tier changes in a documented command before it runs, in order.
SUBSTITUTIONS = (
    Substitution(r"--nproc_per_node \d+", "--nproc_per_node 1", "one CPU process (gloo) for a node's GPUs"),
    Substitution(r"(?<=\s)\.\.\.(?=\s|$)", TINY_EVAL, "`...` of an evaluation: the tiny run's retriever and limits",
                 only_in=r"^mopd eval run "),
    Substitution(r"(?<=\s)\.\.\.(?=\s|$)", TINY_RUN, "`...`, the paper's other settings: the tiny run's"),
    Substitution(r"^mopd pipeline paper(?=\s*(#|$))", "mopd pipeline paper --file {assets}/tiny_paper.yaml",
                 "the paper's pipeline on the tiny run (tiny_paper.yaml: the tier's QA splits, in-process "
                 "bundled index, HF engine, 2 steps, 2 questions x 1 attempt, one process per stage)"),
    Substitution(r"^mopd pipeline paper (?=launcher\.gpus=1)", "mopd pipeline paper --file {assets}/tiny_paper.yaml ",
                 "the same, for the LoRA run of the paper's pipeline on one GPU"),
    Substitution(r"indexes/wiki18-e5", "{assets}/bundled_index",
                 "Search-R1's wiki-18 E5 index -> the bundled corpus's MiniLM index (same format, 2,400 passages)"),
    Substitution(r"--device cuda --faiss-gpu --encoder-devices all", "--device cpu", "a GPU -> the CPU"),
    Substitution(r"(?<=[:\s])8000\b", "{port}", "port 8000 -> a free port of this machine"),
    Substitution(r"/models/my-model", "{assets}/models/tiny", "your model -> the tiny random model"),
    Substitution(r"^\.venv/bin/mopd demo --quick", ".venv/bin/mopd demo --quick trainer.trace_every=1",
                 "the smoke run stands for the full demo (about 25 minutes): it writes token traces every step, as "
                 "the demo does at steps 5 and 10"),
    Substitution(r"\bEVAL_DIR\b", "runs/demo/eval/multiagent_opd", "the placeholder -> the demo's evaluation"),
    Substitution(r"^mopd view records\.jsonl", "mopd view runs/demo/eval/multiagent_opd/records.jsonl",
                 "a records file -> the demo evaluation's"),
    Substitution(r"(?<=\s)runs/demo/", "runs/demo_quick/", "the viewer reads the smoke run's directory for the "
                 "full demo's", only_in=r"^mopd view "),
)


def as_run(text: str, assets: Path, port: int) -> str:
    """The command the tier runs for a documented one."""
    for s in SUBSTITUTIONS:
        if s.only_in and not re.search(s.only_in, text):
            continue
        text = re.sub(s.pattern, s.replacement.replace("\\", "\\\\"), text, flags=re.M)
    return text.replace("{assets}", str(assets)).replace("{port}", str(port))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DocCommandFailed(AssertionError):
    """A documented command that exited non-zero (not a known failure)."""


class KnownFailure(Exception):
    """A documented command that failed as an open issue says it does (the test is xfail strict)."""


class DocShell:
    """One sequence's shell: its working directory, environment and background servers."""

    def __init__(self, cwd: Path, assets: Path, known: dict[str, str] | None = None):
        self.cwd, self.assets, self.port = cwd, assets, free_port()
        cwd.mkdir(parents=True, exist_ok=True)
        # what `mopd data prepare data/ --out splits/` (marked: it needs FlashRAG's datasets) would
        # have written, made of the tiny QA file
        (cwd / "splits").mkdir()
        for split in ("train", "dev", "test"):
            (cwd / "splits" / f"{split}.jsonl").write_text((assets / "qa.jsonl").read_text())
        # docs/method.md's example YAML file of a run's settings
        (cwd / "my_run.yaml").write_text("trainer:\n  lr: 3.0e-6\n  steps: 7\n")
        self.known = dict(known or {})   # a command's first words -> the error text an open issue reports
        self.servers: list[subprocess.Popen] = []
        self.ran: list[tuple[str, str]] = []
        (cwd / ".venv").symlink_to(ROOT / ".venv")
        self.env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
                    "HF_HUB_CACHE": str(assets / "hub"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def run(self, cmd: DocCommand, timeout: float = 1800) -> str:
        """Run one documented command; its output, or DocCommandFailed / KnownFailure."""
        text = as_run(cmd.text, self.assets, self.port)
        self.ran.append((cmd.where, text))
        index = self.assets / "bundled_index"
        if str(index) in text and not index.exists():   # built on first use (about a minute, then cached)
            from mopd.retriever.bundled import bundled_index
            index.symlink_to(bundled_index())
        if cmd.lang == "bash" and (text.rstrip().endswith("&") or " --serve" in text
                                   or text.startswith("mopd retriever serve")):
            return self.start_server(cmd, text)
        argv = ["bash", "-c", text] if cmd.lang == "bash" else [str(ROOT / ".venv" / "bin" / "python"), "-c", text]
        proc = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout)
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            self.failed(cmd, text, f"exit {proc.returncode}", out)
        if self.known_error(cmd) is not None:
            raise AssertionError(f"{cmd.where} now succeeds (a known failure: {self.known_error(cmd)!r}); remove it "
                                 f"from the test's known failures, and the test's xfail marker with the last one")
        return out

    def known_error(self, cmd: DocCommand) -> str | None:
        return next((error for prefix, error in self.known.items() if cmd.text.startswith(prefix)), None)

    def failed(self, cmd: DocCommand, text: str, how: str, out: str):
        error = next((line for line in out.splitlines() if re.search(r"error|Error", line)), out.strip()[-300:])
        message = f"{cmd.where}: `{cmd.text}`\n  ran as `{text}`\n  {how}: {error}\n{out[-3000:]}"
        expected = self.known_error(cmd)
        if expected is not None and expected in out:
            raise KnownFailure(message)
        raise DocCommandFailed(message)

    def start_server(self, cmd: DocCommand, text: str) -> str:
        """Start a documented server (`... &`, `--serve`) and wait until its port answers."""
        argv = shlex.split(text.rstrip().rstrip("&"), comments=True)
        log = (self.cwd / f"server-{len(self.servers)}.log").open("w")
        proc = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.servers.append(proc)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.failed(cmd, text, f"exit {proc.returncode}", Path(log.name).read_text())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return f"serving on 127.0.0.1:{self.port}"
            except OSError:
                time.sleep(0.5)
        self.failed(cmd, text, "no answer on its port in 300 s", Path(log.name).read_text())

    def get(self, path: str, body: dict | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                     headers={"Content-Type": "application/json"} if data else {})
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.read()

    def stop_servers(self):
        """Stop the servers this shell started (SIGINT, as Ctrl-C would), by their process group."""
        for proc in self.servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.servers.clear()
