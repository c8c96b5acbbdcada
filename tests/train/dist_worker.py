"""Worker for the 2-process test: `torchrun --nproc_per_node 2 dist_worker.py MODEL QA OUT`."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository root: tests.helpers

from mopd.config import resolve  # noqa: E402
from mopd.train.distributed import end_process  # noqa: E402
from mopd.train.trainer import PolicyTrainer  # noqa: E402
from tests.helpers.retrievers import FakeRetriever  # noqa: E402
from tests.helpers.training import tiny_overrides  # noqa: E402

model_dir, qa, out = sys.argv[1:4]
resume = len(sys.argv) > 4 and sys.argv[4] == "resume"
cfg = resolve("cmas_rl", tiny_overrides(model_dir, qa, out, **{"trainer.steps": 3}))
t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False, resume=resume)
start = t.step
m = t.fit(2 if not resume else 3)
t.export(Path(out) / "export")
digest = float(sum(p.detach().full_tensor().double().sum() for p in t.model.parameters()))
result = {"rank": t.rank, "start": start, "step": t.step, "loss": m["loss/total"], "digest": digest}
if resume:   # export the step-2 checkpoint as the best one: a model-only load into the sharded model
    from mopd.train import checkpoint as ckpt  # noqa: E402

    ckpt.mark_best(out, 2, "val/em", 1.0)
    t.export(Path(out) / "export_best", which="best")
    result["best_digest"] = float(sum(p.detach().full_tensor().double().sum() for p in t.model.parameters()))
(Path(out) / f"result_rank{t.rank}.json").write_text(json.dumps(result))
t.close()
end_process(0)   # as `mopd train` ends: a plain exit can abort in gloo's threads (mopd.train.distributed)
