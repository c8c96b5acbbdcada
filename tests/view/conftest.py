"""Scripted H-MAS runs for the viewer: two systems' evaluation directories laid out as the pipeline
writes them (``<root>/eval/<system>/records.jsonl`` and ``run.json``), and a training run
directory with token traces."""

import json
import re

import pytest
import torch

from mopd.core.records import write_records
from tests.helpers.prompts import field, role_of, turn_of
from tests.helpers.workflows import run_scripted

QUESTIONS = 4


def hmas_policy(system: str):
    """Leader: two subtasks, then selects both; Searchers search once and report; Answerer answers.
    System "opd" answers every question right; "control" gets odd questions wrong, its Searchers of
    question 2 report without searching, and its Leader writes an invalid action first on question 3."""
    def respond(prompt, params):
        role = role_of(prompt)
        n = int(re.findall(r"band (\d+)", prompt)[-1])
        turn = turn_of(prompt)
        if role == "leader":
            if system == "control" and n == 3 and turn == 1:
                return "I will think about it"
            return (f"<subtask>Where was band {n} formed?</subtask><subtask>Who founded band {n}?</subtask>"
                    if turn <= (2 if system == "control" and n == 3 else 1) else "<select>1,2</select>")
        if role == "searcher":
            sub = field(prompt, "Question")
            if turn == 1 and not (system == "control" and n == 2):
                return f"<search>{sub}</search>"
            return f"<report>band {n} was formed in Town{n}</report>"
        right = system == "opd" or n % 2 == 0
        return f"<answer>{f'Town{n}' if right else 'Nowhere'}</answer>"
    return respond


@pytest.fixture(scope="session")
def view_model_dir(tmp_path_factory):
    from mopd.data.tiny_model import init_tiny_model

    return str(init_tiny_model(tmp_path_factory.mktemp("view_model") / "model"))


@pytest.fixture(scope="session")
def view_tokenizer(view_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(view_model_dir)


def _records(tokenizer, system):
    records, _, _ = run_scripted(tokenizer, hmas_policy(system), workflow="hmas", n_questions=QUESTIONS, attempts=2)
    for r in records:
        r.method = system
    return records


@pytest.fixture(scope="session")
def eval_root(tmp_path_factory, view_tokenizer, view_model_dir):
    """``runs/demo``-like: eval/opd and eval/control, each records.jsonl + run.json naming the model."""
    root = tmp_path_factory.mktemp("demo")
    for system in ("opd", "control"):
        out = root / "eval" / system
        out.mkdir(parents=True)
        write_records(out / "records.jsonl", _records(view_tokenizer, system))
        (out / "run.json").write_text(json.dumps({"settings": {}, "questions": QUESTIONS, "model": view_model_dir}))
    return root


@pytest.fixture(scope="session")
def traced_run(tmp_path_factory, view_tokenizer, view_model_dir):
    """A training run directory whose traces.jsonl holds two steps of the scripted workflows, with
    known values: old = sampling - 0.5, teacher = old + 1 on Searcher tokens and 1 elsewhere."""
    from mopd.algo.advantages import role_specs
    from mopd.config import resolve
    from mopd.train.step_batches import pack_records
    from mopd.train.token_trace import append_traces, trace_lines

    run = tmp_path_factory.mktemp("run")
    (run / "config.yaml").write_text(f"model:\n  path: {view_model_dir}\n")
    cfg = resolve("mopd")
    for step_no in (5, 10):
        records = _records(view_tokenizer, "opd")
        step = pack_records(records, 4096, device=torch.device("cpu"))
        for b in step.batches:
            b.old_logp = b.sampling_logp - 0.5
            b.teacher_logp = b.old_logp + 1.0
        advantages = [{c.call_id: 0.5 for c in r.calls if c.role != "searcher"} for r in records]
        step.fill_advantages(advantages)
        append_traces(run, trace_lines(step_no, records, step, role_specs(cfg.algo), rewards=advantages,
                                       advantages=advantages, teacher_roles=["searcher"], count=3))
    return run
