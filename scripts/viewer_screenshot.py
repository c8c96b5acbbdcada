"""docs/viewer.png: the viewer on two scripted H-MAS systems side by side, Searcher tokens coloured
by OPD's teacher-minus-student log-prob (``mopd view A B --teacher``; two random tiny models, so the
colours show the mechanism, not a trained teacher's judgement).

Run: PYTHONPATH=. .venv/bin/python scripts/viewer_screenshot.py [OUT.png]
Needs chromium, chromium-driver and selenium (`make test-browser` installs them).
"""

import sys
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from mopd.cli import main
from mopd.data.tiny_model import init_tiny_model
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
    with chromium() as driver:
        driver.get(page.as_uri())
        wait_for(driver, "document.body.dataset.ready === '1'")
        driver.execute_script("const e = document.getElementById('f-sort'); e.value = 'diff';"
                              "e.dispatchEvent(new Event('change'))")
        driver.execute_script("document.querySelectorAll('#list-body tr.qrow')[1].click()")   # q3: an invalid action
        wait_for(driver, "document.getElementById('detail').dataset.ready === '3'")
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    return out


if __name__ == "__main__":
    print(shoot(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/viewer.png")))
