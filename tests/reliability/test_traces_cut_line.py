"""``traces.jsonl`` cut mid-line by a kill, then the run resumed: the cut line is dropped when the
file is next appended to (as ``metrics.jsonl``'s is), so the resumed run's first trace is a line of
its own and every traced workflow after the cut is read back (before: glued to the cut line and
lost, the steps' workflow counts read 2, 1, 1, 2)."""

import json
import random
from collections import Counter

import pytest

from mopd.train.token_trace import TRACES_FILE, append_traces, cut_back_to_last_line
from mopd.view.sources import read_traces


def _lines(step, n, rng):
    return [{"step": step, "record": {"dataset": "d", "question_id": f"q{i}", "question": "x" * rng.randrange(1, 300),
                                      "answers": ["a"], "calls": [], "events": []}, "calls": {}}
            for i in range(n)]


@pytest.mark.parametrize("cut_at", [0.1, 0.5, 0.97])
def test_a_trace_appended_after_a_cut_line_is_a_line_of_its_own(tmp_path, cut_at):
    rng = random.Random(int(cut_at * 100))
    append_traces(tmp_path, _lines(1, 3, rng))
    path = tmp_path / TRACES_FILE
    whole = path.read_bytes()
    half = json.dumps(_lines(2, 1, rng)[0]).encode()
    path.write_bytes(whole + half[:int(len(half) * cut_at)])            # killed mid-write of step 2
    append_traces(tmp_path, _lines(2, 3, rng))                          # the resumed run traces step 2 again
    append_traces(tmp_path, _lines(3, 3, rng))
    text = path.read_text(encoding="utf-8")
    assert text.startswith(whole.decode()) and text.endswith("\n")
    steps = Counter(json.loads(line)["step"] for line in text.splitlines())      # every line is whole JSON
    assert steps == {1: 3, 2: 3, 3: 3}
    assert Counter(k[0] for k in read_traces(path)) == {1: 3, 2: 3, 3: 3}


def test_cutting_back_keeps_whole_lines_and_empties_a_file_of_one_cut_line(tmp_path):
    rng = random.Random(5)
    path = tmp_path / "f.jsonl"
    body = "".join(json.dumps({"n": i, "pad": "é" * rng.randrange(0, 40000)}) + "\n" for i in range(7))
    path.write_text(body + '{"n": 7, "pad": "ab', encoding="utf-8")
    assert cut_back_to_last_line(path) == len('{"n": 7, "pad": "ab')
    assert path.read_text(encoding="utf-8") == body
    assert cut_back_to_last_line(path) == 0 and path.read_text(encoding="utf-8") == body
    path.write_bytes(b'{"cut')
    assert cut_back_to_last_line(path) == 5 and path.read_bytes() == b""
