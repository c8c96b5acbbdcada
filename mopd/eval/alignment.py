"""Line up the records of several systems question by question and attempt by attempt.

Every comparison in the evaluation is paired: system A's attempt k on question i is compared with
system B's attempt k on the same question, and the bootstrap resamples questions with all their
attempts and all systems together. This module builds that grid once. Records are keyed by
``(dataset, question_id, attempt)``; questions are ordered by (dataset, question id) so that the
result (and hence every bootstrap draw) does not depend on the order of the record files.

A system that lacks a record another system has is an error naming both, unless the caller asks
for the intersection, in which case what was dropped is counted and reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from mopd.core.records import WorkflowRecord

QuestionKey = Tuple[str, str]  # (dataset, question_id)


class EvalError(ValueError):
    """Records that cannot be evaluated together (missing, duplicated, inconsistent)."""


@dataclass
class AlignedRuns:
    """Records of S systems on the same Q questions with the same K attempts each."""

    systems: List[str]
    datasets: List[str]
    """Dataset names, sorted; ``dataset_index`` points into this list."""
    questions: List[QuestionKey]
    """(dataset, question_id) of each question, sorted."""
    dataset_index: np.ndarray
    """[Q] int: the dataset of each question."""
    attempts: List[int]
    """The attempt ids every question has, sorted (K of them)."""
    records: List[List[WorkflowRecord]]
    """[S][Q*K], row-major over (question, attempt)."""
    dropped: Dict[str, int] = field(default_factory=dict)
    """Records of each system left out by ``intersect=True`` (empty otherwise)."""

    @property
    def k(self) -> int:
        return len(self.attempts)

    @property
    def shape(self) -> Tuple[int, int, int]:
        return len(self.systems), len(self.questions), len(self.attempts)

    def questions_per_dataset(self) -> np.ndarray:
        return np.bincount(self.dataset_index, minlength=len(self.datasets))

    def grid(self, fn: Callable[[WorkflowRecord], object], dtype=float) -> np.ndarray:
        """``fn`` applied to every record, as an array [S, Q, K] (or [S, Q, K, F] for tuples)."""
        s, q, k = self.shape
        rows = [np.asarray([fn(r) for r in recs], dtype=dtype) for recs in self.records]
        arr = np.stack(rows) if rows else np.zeros((0, q * k), dtype=dtype)
        return arr.reshape((s, q, k) + arr.shape[2:])


def _index(system: str, records: Sequence[WorkflowRecord]) -> Dict[QuestionKey, Dict[int, WorkflowRecord]]:
    out: Dict[QuestionKey, Dict[int, WorkflowRecord]] = {}
    for r in records:
        per_q = out.setdefault((r.dataset, r.question_id), {})
        if r.attempt in per_q:
            raise EvalError(f"system {system!r} has two records of question {r.dataset}/{r.question_id} "
                            f"attempt {r.attempt}")
        per_q[r.attempt] = r
    return out


def align_runs(records_by_system: Mapping[str, Sequence[WorkflowRecord]],
               intersect: bool = False) -> AlignedRuns:
    """Build the [system, question, attempt] grid.

    Without ``intersect``, every system must have every (dataset, question, attempt) that any
    system has, and every question the same attempts; the first violation is raised as an
    ``EvalError`` naming the system and the question. With ``intersect``, only the keys all systems
    share are kept, then only questions that have every attempt seen among them.
    """
    if not records_by_system:
        raise EvalError("no systems to evaluate")
    systems = list(records_by_system)
    index = {s: _index(s, records_by_system[s]) for s in systems}
    for s in systems:
        if not index[s]:
            raise EvalError(f"system {s!r} has no records")
    dropped: Dict[str, int] = {}
    if intersect:
        shared = set.intersection(*(set(index[s]) for s in systems))
        attempts_of = {q: set.intersection(*(set(index[s][q]) for s in systems)) for q in shared}
        all_attempts = set().union(*attempts_of.values()) if attempts_of else set()
        keep = sorted(q for q in shared if attempts_of[q] == all_attempts)
        if not keep:
            raise EvalError("the systems share no question with the same attempts; nothing to evaluate")
        attempts = sorted(all_attempts)
        kept = len(keep) * len(attempts)
        dropped = {s: len(records_by_system[s]) - kept for s in systems}
    else:
        keep, attempts = _check_complete(systems, index)
    _check_same_questions(systems, index, keep)
    datasets = sorted({d for d, _ in keep})
    d_id = {d: i for i, d in enumerate(datasets)}
    return AlignedRuns(
        systems=systems,
        datasets=datasets,
        questions=keep,
        dataset_index=np.asarray([d_id[d] for d, _ in keep], dtype=np.int64),
        attempts=attempts,
        records=[[index[s][q][a] for q in keep for a in attempts] for s in systems],
        dropped=dropped,
    )


def _check_complete(systems: List[str], index) -> Tuple[List[QuestionKey], List[int]]:
    all_q = sorted(set().union(*(set(index[s]) for s in systems)))
    all_attempts = sorted(set().union(*(set(a) for s in systems for a in index[s].values())))
    hint = "; pass intersect (--intersect) to compare on the questions all systems share"
    for q in all_q:
        for s in systems:
            have = index[s].get(q)
            if have is None:
                other = next(o for o in systems if q in index[o])
                raise EvalError(f"system {s!r} has no record of question {q[0]}/{q[1]} "
                                f"(system {other!r} has it){hint}")
            missing = [a for a in all_attempts if a not in have]
            if missing:
                raise EvalError(f"system {s!r} lacks attempt(s) {missing} of question {q[0]}/{q[1]} "
                                f"(every question must have attempts {all_attempts}){hint}")
    return all_q, all_attempts


def _check_same_questions(systems: List[str], index, keep: Sequence[QuestionKey]) -> None:
    """Every record of a question carries the same question text and the same gold answers (as a
    set): the same ids with another text or other answers mean the runs were made on different
    test files, and their EM cannot be compared."""
    for q in keep:
        first = None
        for s in systems:
            for a, r in sorted(index[s][q].items()):
                gold = sorted(set(r.answers))
                if first is None:
                    first = (s, a, gold, r.question)
                elif r.question != first[3]:
                    raise EvalError(f"question {q[0]}/{q[1]} reads {_cut(r.question)} in system {s!r} (attempt {a}) "
                                    f"but {_cut(first[3])} in system {first[0]!r} (attempt {first[1]}): the runs were "
                                    "made on different test files")
                elif gold != first[2]:
                    raise EvalError(f"question {q[0]}/{q[1]} has gold answers {gold} in system {s!r} (attempt {a}) "
                                    f"but {first[2]} in system {first[0]!r} (attempt {first[1]}): the runs were "
                                    "made on different test files")


def _cut(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")
