"""`mopd train` and `mopd eval run` with ``rollout.engine=vllm``, end to end on the quick tiny world
(real BM25 retriever), with the CPU defaults only: no memory or engine flag on the command line."""

import json

import pytest

from tests.helpers.vllm import require_vllm

require_vllm()

from mopd.cli import main  # noqa: E402
from mopd.core.records import read_records  # noqa: E402
from tests.helpers.training import tiny_overrides  # noqa: E402

VLLM_TRAINING = ["rollout.engine=vllm", "trainer.old_logprobs=recompute"]
"""The tiny presets take pi_old from the rollout's log-probs, which the trainer accepts from the HF
engine only (vLLM computes them in other kernels); with vLLM it recomputes them, as on a GPU."""

SHORT = ["rollout.max_output_tokens=24", "rollout.max_steps=2", "rollout.max_rounds=2", "rollout.max_input_tokens=1024"]


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def stage1(vllm_model_dir, quick_world, tmp_path_factory):
    """Stage I (tiny_cmas_rl), two steps with the vLLM engine, exported as the teacher."""
    root = tmp_path_factory.mktemp("stage1")
    args = ["train", "--steps", "2", "--export", str(root / "teacher"), "tiny_cmas_rl",
            *tiny_overrides(vllm_model_dir, quick_world.train, root / "run"),
            f"retriever.index={quick_world.index}", *VLLM_TRAINING]
    assert main(args) == 0
    return root


def test_stage1_trains_two_steps_on_vllm_rollouts(stage1):
    rows = [r for r in metrics(stage1 / "run") if "rollout/em" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/output_tokens"] > 0 for r in rows if "rollout/output_tokens" in r)
    assert (stage1 / "teacher" / "config.json").is_file()


def test_stage2_with_the_stage1_teacher_trains_two_steps_on_vllm_rollouts(stage1, vllm_model_dir, quick_world,
                                                                          tmp_path):
    args = ["train", "--steps", "2", "tiny_mopd",
            *tiny_overrides(vllm_model_dir, quick_world.train, tmp_path / "run"),
            f"teacher.path={stage1 / 'teacher'}", f"retriever.index={quick_world.index}", *VLLM_TRAINING]
    assert main(args) == 0
    rows = [r for r in metrics(tmp_path / "run") if "rollout/em" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/tokens_per_s/leader"] > 0 for r in rows)        # H-MAS rollouts on vLLM
    assert all("loss/leader_kl" in r for r in rows)                     # scored against the teacher


@pytest.mark.parametrize("workflow", ["cmas", "hmas"])
def test_eval_run_with_vllm_writes_every_workflow(workflow, vllm_model_dir, quick_world, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", "run", "--model", vllm_model_dir, "--workflow", workflow, "--manifest", str(quick_world.test),
            "--attempts", "2", "--limit", "4", "--out", str(out), "rollout.engine=vllm",
            f"retriever.index={quick_world.index}", *SHORT]
    assert main(args) == 0
    recs = read_records(out / "records.jsonl")
    assert len(recs) == 8 and {r.workflow for r in recs} == {workflow}
    assert all(r.output_tokens > 0 for r in recs)
    if workflow == "hmas":
        assert {c.role for r in recs for c in r.calls} >= {"leader", "answerer"}


def test_greedy_rollouts_of_a_trained_export_agree_between_hf_and_vllm(stage1, quick_world, tmp_path):
    texts = {}
    for engine in ("hf", "vllm"):
        out = tmp_path / engine
        args = ["eval", "run", "--model", str(stage1 / "teacher"), "--workflow", "cmas", "--manifest",
                str(quick_world.test), "--attempts", "1", "--limit", "6", "--out", str(out),
                f"rollout.engine={engine}", "eval.temperature=0", f"retriever.index={quick_world.index}", *SHORT]
        assert main(args) == 0
        texts[engine] = [[s.text for c in r.calls for s in c.segments] for r in read_records(out / "records.jsonl")]
    assert texts["hf"] == texts["vllm"]
    assert len({tuple(t) for t in texts["hf"]}) > 1
