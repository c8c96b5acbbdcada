"""docs/viewer.png: the viewer on two scripted H-MAS systems side by side, Searcher tokens coloured
by OPD's teacher-minus-student log-prob (``mopd view A B --teacher``; two random tiny models, so the
colours show the mechanism, not a trained teacher's judgement). With ``--demo RUN``, the same view
of a finished demo run: MultiAgent-OPD against its no-Searcher-supervision control, scored by the
run's Stage-I teacher, on the question where they differ most (and the page itself beside the PNG).

Run: PYTHONPATH=. .venv/bin/python scripts/viewer_screenshot.py [OUT.png] [--demo runs/demo [--row N]]
Needs chromium, chromium-driver and selenium (`make test-browser` installs them).
"""

import argparse
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from mopd.cli import main
from tests.helpers.tiny_model import init_tiny_model
from tests.helpers.browser import chromium, wait_for
from tests.helpers.scripted_hmas import write_eval_dirs


def shoot(out: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix="mopd-viewer-shot-"))
    student = str(init_tiny_model(root / "student"))
    teacher = str(init_tiny_model(root / "teacher", seed=1))
    write_eval_dirs(root, AutoTokenizer.from_pretrained(student), student)
    page = root / "view.html"
    assert main(["view", str(root / "eval" / "opd"), str(root / "eval" / "control"), "--names", "MultiAgent-OPD",
                 "No Searcher supervision", "--teacher", teacher, "--out", str(page)]) == 0
    return screenshot(page, out, row=1)   # q3: an invalid action


def shoot_demo(run: Path, out: Path, row: int) -> Path:
    """The demo's two Stage II arms side by side, Searcher tokens scored by its Stage-I teacher; the
    page is written next to the PNG (``OUT.html``)."""
    page = out.with_suffix(".html")
    assert main(["view", str(run / "eval" / "multiagent_opd"), str(run / "eval" / "no_searcher_supervision"),
                 "--names", "MultiAgent-OPD", "No Searcher supervision", "--teacher", str(run / "stage1" / "export"),
                 "--out", str(page)]) == 0
    return screenshot(page, out, row)


def screenshot(page: Path, out: Path, row: int) -> Path:
    """A PNG of ``page`` sorted by the largest difference, with list row ``row`` opened."""
    with chromium() as driver:
        driver.get(page.resolve().as_uri())
        wait_for(driver, "document.body.dataset.ready === '1'")
        driver.execute_script("const e = document.getElementById('f-sort'); e.value = 'diff';"
                              "e.dispatchEvent(new Event('change'))")
        driver.execute_script(f"document.querySelectorAll('#list-body tr.qrow')[{int(row)}].click()")
        wait_for(driver, "document.getElementById('detail').dataset.ready !== undefined")
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="docs/viewer.png")
    parser.add_argument("--demo", default=None, help="a finished demo run directory (e.g. runs/demo)")
    parser.add_argument("--row", type=int, default=0, help="with --demo: which list row to open (sorted by difference)")
    args = parser.parse_args()
    print(shoot_demo(Path(args.demo), Path(args.out), args.row) if args.demo else shoot(Path(args.out)))
