"""Scripted H-MAS runs of two systems for the viewer's tests, its bench and its screenshot: the
records come out of the real H-MAS state machine (``run_scripted``), so they have Leader turns,
waves of Searchers with searches and passages, Answerer candidates, an invalid action and a
workflow without a search."""

import json
import re
from pathlib import Path

from mopd.core.records import write_records
from tests.helpers.prompts import field, role_of, turn_of
from tests.helpers.workflows import run_scripted

QUESTIONS = 4
SYSTEMS = ("opd", "control")


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


def scripted_records(tokenizer, system):
    records, _, _ = run_scripted(tokenizer, hmas_policy(system), workflow="hmas", n_questions=QUESTIONS, attempts=2)
    for r in records:
        r.method = system
    return records


def write_eval_dirs(root: Path, tokenizer, model_dir: str) -> Path:
    """``root/eval/<system>/records.jsonl`` and ``run.json`` (naming the model), as the pipeline
    lays out an evaluation, for both systems; returns ``root``."""
    for system in SYSTEMS:
        out = Path(root) / "eval" / system
        out.mkdir(parents=True, exist_ok=True)
        write_records(out / "records.jsonl", scripted_records(tokenizer, system))
        (out / "run.json").write_text(json.dumps({"settings": {}, "questions": QUESTIONS, "model": model_dir}))
    return Path(root)
