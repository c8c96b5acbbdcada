"""The viewer in headless Chromium (`make test-browser`): the page written from scripted H-MAS runs
opens offline, its tree, filters, token colouring and comparison respond, and the console stays
free of errors."""

import os

import pytest

from mopd.cli import main
from tests.helpers.browser import chromium, console_errors, missing, wait_for

pytestmark = [pytest.mark.browser]
if missing():
    if os.environ.get("MOPD_REQUIRE_BROWSER") == "1":   # `make test-browser`: a missing browser is a failure
        raise RuntimeError(missing())
    pytest.skip(missing(), allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def compare_page(eval_root):
    out = eval_root / "compare.html"
    assert main(["view", str(eval_root / "eval" / "opd"), str(eval_root / "eval" / "control"),
                 "--out", str(out)]) == 0
    return out


def js(driver, script):
    return driver.execute_script(f"return {script}")


def load(driver, page, fragment=""):
    driver.get(page.as_uri() + fragment)
    wait_for(driver, "document.body.dataset.ready === '1'")


def rows(driver):
    return js(driver, "[...document.querySelectorAll('#list-body tr.qrow')].map(r => r.cells[1].title)")


def choose(driver, element_id, value):
    driver.execute_script(f"const e = document.getElementById('{element_id}'); e.value = arguments[0]; "
                          "e.dispatchEvent(new Event('change'))", value)


def tick(driver, element_id):
    driver.find_element("id", element_id).click()


def open_row(driver, i):
    driver.execute_script("document.getElementById('detail').dataset.ready = ''")
    driver.find_elements("css selector", "#list-body tr.qrow")[i].click()
    wait_for(driver, "document.getElementById('detail').dataset.ready !== ''")


def test_the_tree_of_a_workflow_renders_in_time_order(browser, compare_page):
    load(browser, compare_page)
    assert js(browser, "document.getElementById('count').textContent").startswith("4 of 4 questions")
    open_row(browser, 0)
    col = "document.querySelector('#detail .col[data-system=\"0\"]')"
    kinds = js(browser, f"[...{col}.querySelectorAll('.wf > details.node > summary .role')].map(e => e.textContent)")
    assert kinds == ["leader turn 1", "wave 1 · 2 searcher(s)", "leader turn 2", "answerer · 1 candidate(s)"]
    assert js(browser, f"{col}.querySelectorAll('details.searcher').length") == 2
    titles = js(browser, f"[...{col}.querySelectorAll('.ev-search .passages summary')].map(e => e.textContent)")
    assert titles[:3] == ["T0", "T1", "T2"]
    assert "band 0 was formed in Town0" in js(browser, f"{col}.querySelector('.ev-report').textContent")
    # the role prompt is folded away; opening it shows it
    fold = browser.find_element("css selector", "#detail .col details.env")
    assert fold.text == "role prompt (folded)"
    fold.click()
    assert "You are the Leader" in fold.text
    assert "final answer: Town0 · solved" in js(browser, f"{col}.querySelector('.final').textContent")
    assert console_errors(browser) == []


def test_filters_respond(browser, compare_page):
    load(browser, compare_page)
    choose(browser, "f-solved", "unsolved")
    assert rows(browser) == ["q1", "q3"]                  # the control's odd questions
    choose(browser, "f-solved", "")
    choose(browser, "f-role", "leader")
    tick(browser, "f-invalid")
    assert rows(browser) == ["q3"]                        # the control's Leader wrote no action first
    tick(browser, "f-invalid")
    choose(browser, "f-role", "")
    tick(browser, "f-nosearch")
    assert rows(browser) == ["q2"]                        # the control's Searchers reported unsearched
    tick(browser, "f-nosearch")
    box = browser.find_element("id", "f-text")
    box.send_keys("town2")
    wait_for(browser, "document.querySelectorAll('#list-body tr.qrow').length === 1")
    assert rows(browser) == ["q2"]
    box.clear()
    box.send_keys("nowhere")                              # a final answer of the control
    wait_for(browser, "document.getElementById('count').textContent.startsWith('2 of')")
    assert rows(browser) == ["q1", "q3"]
    choose(browser, "f-dataset", "toy")
    assert rows(browser) == ["q1", "q3"]
    assert console_errors(browser) == []


def test_two_systems_side_by_side_and_sorted_by_difference(browser, compare_page):
    load(browser, compare_page)
    choose(browser, "f-sort", "diff")
    assert rows(browser) == ["q1", "q3", "q0", "q2"]
    open_row(browser, 0)
    heads = js(browser, "[...document.querySelectorAll('#detail .col h2')].map(e => e.textContent)")
    assert heads == ["opd · 1.00", "control · 0.00"]
    finals = js(browser, "[...document.querySelectorAll('#detail .col .final')].map(e => e.textContent)")
    assert finals == ["final answer: Town1 · solved", "final answer: Nowhere · not solved"]
    # another attempt of one system, the other column unchanged
    browser.find_elements("css selector", "#detail .col[data-system='1'] .attempts button")[1].click()
    wait_for(browser, "document.querySelector('#detail .col[data-system=\"1\"] .attempts button.cur')"
                      ".textContent.startsWith('attempt 1')")
    # the report's links open a question by its dataset and id
    load(browser, compare_page, "#q=toy/q3")
    wait_for(browser, "document.getElementById('detail').dataset.ready === '3'")
    assert "invalid action: expected <subtask> or <select>" in js(
        browser, "document.querySelector('#detail .col[data-system=\"1\"]').textContent")
    assert console_errors(browser) == []


def test_tokens_are_coloured_by_the_traced_signal(browser, traced_run):
    assert main(["view", str(traced_run)]) == 0
    load(browser, traced_run / "view.html")
    assert js(browser, "document.getElementById('f-signal').value") == "opd"
    open_row(browser, 0)
    col = "document.querySelector('#detail .col')"
    searcher = js(browser, f"[...{col}.querySelectorAll('details.searcher .tok')].map(t => [t.dataset.v, t.title, "
                           "getComputedStyle(t).backgroundColor])")
    assert searcher and all(v == "1" and t.startswith("opd 1.00") for v, t, _ in searcher)
    assert all(bg.startswith("rgba(40, 160, 70") for _, _, bg in searcher)     # positive: green
    # the Leader has no teacher: its turns show plain text under the OPD colouring
    assert js(browser, f"{col}.querySelectorAll('details.leader .tok').length") == 0
    choose(browser, "f-signal", "old")
    wait_for(browser, "document.querySelector('#detail .col details.searcher .tok') !== null && "
                      "document.querySelector('#detail .col details.searcher .tok').title.startsWith('old')")
    assert js(browser, "document.querySelector('#detail .col details.searcher .tok').dataset.v") == "-0.5"
    choose(browser, "f-signal", "advantage")
    wait_for(browser, "document.querySelector('#detail .col details.leader .tok') !== null")
    assert js(browser, "document.querySelector('#detail .col details.leader .tok').dataset.v") == "0.5"
    assert "training step 5" in js(browser, f"{col}.textContent")
    assert console_errors(browser) == []


HOSTILE_QUESTIONS = ["<!--<script>", "</script><script>window.ran = 1</script>", "<img src=x onerror='window.ran=2'>",
                     "a\u2028b\u2029c & <b>d</b>", "lone \ud800 surrogate", "-->--!><!--", "rate-50%"]


def _records_page(root, questions, finals, title="mopd view"):
    """A page of one workflow per question (dataset ds; ids h0, h1, ... but rate-50% as itself)."""
    import json

    from tests.helpers.records import call, record

    rows = []
    for i, (q, final) in enumerate(zip(questions, finals)):
        d = record("rate-50%" if q == "rate-50%" else f"h{i}", candidates=["<answer>x</answer>"],
                   calls=[call("l0", "leader", [f"<subtask>{q}</subtask>"])]).to_dict()
        d.update(dataset="ds", question=q, final_answer=final)
        rows.append(json.dumps(d))
    (root / "records.jsonl").write_text("\n".join(rows) + "\n")
    assert main(["view", str(root), "--title", title]) == 0
    return root / "view.html"


@pytest.fixture(scope="module")
def hostile_page(tmp_path_factory):
    """A page written from records whose texts a model could have written to break it."""
    finals = ["\u202eevil"] + HOSTILE_QUESTIONS[1:]
    return _records_page(tmp_path_factory.mktemp("hostile"), HOSTILE_QUESTIONS, finals,
                         "</title><script>window.ran = 3</script>")


@pytest.fixture(scope="module")
def bidi_page(tmp_path_factory):
    """Records that only reverse text direction or hold a % in an id (nothing else to trip on)."""
    questions = ["Where?", "When?", "Who?", "rate-50%"]
    return _records_page(tmp_path_factory.mktemp("bidi"), questions, ["\u202eevil", "x", "y", "z"])


def test_a_page_from_hostile_records_shows_every_row_as_text_and_runs_nothing(browser, hostile_page):
    load(browser, hostile_page)
    assert js(browser, "document.querySelectorAll('#list-body tr.qrow').length") == len(HOSTILE_QUESTIONS)
    shown = js(browser, "[...document.querySelectorAll('#list-body tr.qrow')].map(r => r.cells[1].textContent)")
    assert shown == [q.replace("\ud800", "\ufffd") for q in HOSTILE_QUESTIONS]
    assert js(browser, "window.ran === undefined && document.querySelectorAll('img, b').length === 0")
    open_row(browser, 1)
    assert "</script><script>window.ran = 1</script>" in js(browser, "document.getElementById('detail').textContent")
    assert js(browser, "window.ran === undefined") and console_errors(browser) == []


def test_record_text_cannot_turn_the_pages_own_labels_right_to_left(browser, bidi_page):
    load(browser, bidi_page)
    open_row(browser, 0)
    final = "document.querySelector('#detail .col .final')"
    assert js(browser, f"{final}.textContent") == "final answer: \u202eevil · not solved"
    # where "not solved" is drawn: its first letter left of its last (left to right, as written)
    xs = js(browser, f"""(() => {{ const t = [...{final}.childNodes].find(n => n.nodeType === 3 &&
        n.textContent.includes('not solved')); const at = t.textContent.indexOf('not solved');
        const x = k => {{ const r = document.createRange(); r.setStart(t, k); r.setEnd(t, k + 1);
                         return r.getBoundingClientRect().left; }};
        return [x(at), x(at + 9)]; }})()""")
    assert xs[0] < xs[1], xs
    assert console_errors(browser) == []


@pytest.mark.parametrize("fragment,opens", [("#q=ds/rate-50%", True), ("#q=ds/rate-50%25", True), ("#q=%E0%A4%A", False),
                                            ("#q=ds%2Fh0", True), ("#q=ds/h9", False), ("#q=ds/h2", True)])
def test_a_fragment_that_is_not_valid_percent_encoding_still_loads_the_page(browser, bidi_page, fragment, opens):
    browser.get("about:blank")                      # a fresh document each time, not a hash change
    load(browser, bidi_page, fragment)           # load() waits for the page to be ready
    if opens:
        wait_for(browser, "document.getElementById('detail').dataset.ready !== undefined")
    else:
        assert js(browser, "document.getElementById('detail').dataset.ready === undefined")
    assert console_errors(browser) == []
