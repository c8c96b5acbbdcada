"""The questions on which two systems differ most: their per-question strict avg@K, side by side.

The report links each dataset's largest differences to the viewer's page of the two systems
(``mopd view A B --out REPORT/view.html``: ``view.html#q=DATASET/ID`` opens that question).
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from mopd.eval.metrics import score_record

QuestionKey = Tuple[str, str]
"""(dataset, question id)."""


def question_scores(records: Sequence) -> Dict[QuestionKey, float]:
    """Each question's mean strict score over its attempts."""
    sums: Dict[QuestionKey, List[float]] = {}
    for r in records:
        s = sums.setdefault((r.dataset, r.question_id), [0.0, 0.0])
        s[0] += float(score_record(r)[0])
        s[1] += 1.0
    return {k: v[0] / v[1] for k, v in sums.items()}


def largest_differences(a: Sequence, b: Sequence, per_dataset: int = 5) -> Dict[str, List[dict]]:
    """{dataset: up to ``per_dataset`` questions both systems ran, largest |a - b| first (ties in
    question order), each ``{"id", "a", "b"}``}; questions on which they agree are left out."""
    sa, sb = question_scores(a), question_scores(b)
    out: Dict[str, List[dict]] = {}
    for key in sa:
        if key in sb and sa[key] != sb[key]:
            out.setdefault(key[0], []).append({"id": key[1], "a": sa[key], "b": sb[key]})
    return {d: sorted(rows, key=lambda r: -abs(r["a"] - r["b"]))[:per_dataset] for d, rows in out.items()}
