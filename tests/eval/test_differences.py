"""The questions where two systems differ most, and the report's links to them in the viewer."""

from mopd.core.records import write_records
from mopd.eval.differences import largest_differences, question_scores
from mopd.eval.report import ReportOptions, report_runs
from tests.helpers.eval_records import WRONG, make_record, right


def _runs():
    # a: q1 4/4, q2 2/4, q3 0/4, q4 1/4 (dataset e); b: q1 0/4, q2 2/4, q3 1/4, q4 4/4
    a = [make_record(q, d, k, right() if k < n else WRONG)
         for q, d, n in (("q1", "d", 4), ("q2", "d", 2), ("q3", "d", 0), ("q4", "e", 1)) for k in range(4)]
    b = [make_record(q, d, k, right() if k < n else WRONG)
         for q, d, n in (("q1", "d", 0), ("q2", "d", 2), ("q3", "d", 1), ("q4", "e", 4)) for k in range(4)]
    return a, b


def test_largest_differences_by_hand():
    a, b = _runs()
    assert question_scores(a) == {("d", "q1"): 1.0, ("d", "q2"): 0.5, ("d", "q3"): 0.0, ("e", "q4"): 0.25}
    got = largest_differences(a, b, per_dataset=5)
    assert got == {"d": [{"id": "q1", "a": 1.0, "b": 0.0}, {"id": "q3", "a": 0.0, "b": 0.25}],   # q2 ties: left out
                   "e": [{"id": "q4", "a": 0.25, "b": 1.0}]}
    assert largest_differences(a, b, per_dataset=1)["d"] == [{"id": "q1", "a": 1.0, "b": 0.0}]


def test_the_report_links_the_largest_differences_into_the_viewer(tmp_path):
    a, b = _runs()
    write_records(tmp_path / "opd" / "records.jsonl", a)
    write_records(tmp_path / "control" / "records.jsonl", b)
    report = report_runs([tmp_path / "opd", tmp_path / "control"], tmp_path / "report",
                         ReportOptions(draws=50, make_plots=False)).read_text()
    assert "Questions where opd and control differ most" in report
    assert "| d | [q1](view.html#q=d/q1) (+100), [q3](view.html#q=d/q3) (-25) |" in report
    assert "[q4](view.html#q=e/q4) (-75)" in report
    one = report_runs([tmp_path / "opd"], tmp_path / "one", ReportOptions(draws=50, make_plots=False)).read_text()
    assert "differ most" not in one


def test_the_linked_system_can_be_chosen(tmp_path):
    a, b = _runs()
    for name, recs in (("opd", a), ("base", a), ("control", b)):
        write_records(tmp_path / name / "records.jsonl", recs)
    runs = [tmp_path / n for n in ("opd", "base", "control")]
    default = report_runs(runs, tmp_path / "r1", ReportOptions(draws=50, make_plots=False)).read_text()
    assert "opd and base differ most" not in default     # identical records: nothing to link
    chosen = report_runs(runs, tmp_path / "r2", ReportOptions(draws=50, make_plots=False, linked="control"))
    assert "Questions where opd and control differ most" in chosen.read_text()
