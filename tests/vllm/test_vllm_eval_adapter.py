"""Evaluating a LoRA adapter directory on the real vLLM engine (CPU build): ``build_engine`` starts vLLM
on the base the adapter names, with room for the adapter's rank, and loads it; its greedy tokens are
those of the HF engine, which merges the same adapter into the base. ``mopd eval run --model
ADAPTER_DIR rollout.engine=vllm`` then runs as with a full model."""

import json

import pytest

from tests.helpers.vllm import require_vllm

require_vllm()

from mopd.cli import main  # noqa: E402
from mopd.config import RolloutConfig  # noqa: E402
from mopd.core.records import read_records  # noqa: E402
from mopd.rollout.engines import build_engine  # noqa: E402
from mopd.rollout.hf_engine import HFEngine  # noqa: E402
from tests.eval.test_eval_adapter import greedy, write_adapter  # noqa: E402
from tests.vllm.conftest import MAX_INPUT, MAX_OUTPUT  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
RANK = 4
"""Below vLLM's smallest slot rank (8): the engine reserves the smallest one that holds it."""


@pytest.fixture(scope="module")
def adapter(vllm_model_dir, tmp_path_factory):
    from pathlib import Path

    return write_adapter(Path(vllm_model_dir), tmp_path_factory.mktemp("adapter") / "a", seed=4, rank=RANK)


def test_vllm_starts_on_the_adapters_base_loads_it_and_samples_what_the_merged_hf_engine_does(adapter, hf_reference):
    engine = build_engine(RolloutConfig(engine="vllm", max_input_tokens=MAX_INPUT, max_output_tokens=MAX_OUTPUT,
                                        seed=5), str(adapter))
    try:
        assert engine.lora_request is not None and engine.lora_rank == RANK
        ours = greedy(engine, seed=3, n=6, new_tokens=12)
        merged = HFEngine.from_pretrained(str(adapter), device="cpu", prefix_cache_mb=0)
        assert ours == greedy(merged, seed=3, n=6, new_tokens=12)
        assert ours != greedy(hf_reference, seed=3, n=6, new_tokens=12)   # not the base
    finally:
        engine.close()


def test_eval_run_on_vllm_takes_an_adapter_dir(adapter, quick_world, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", "run", "--model", str(adapter), "--workflow", "cmas", "--manifest", str(quick_world.test),
            "--attempts", "1", "--limit", "2", "--out", str(out), "rollout.engine=vllm",
            f"retriever.index={quick_world.index}", "rollout.max_output_tokens=16", "rollout.max_steps=2",
            "rollout.max_input_tokens=1024"]
    assert main(args) == 0
    recs = read_records(out / "records.jsonl")
    assert len(recs) == 2 and all(r.output_tokens > 0 for r in recs)
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["engine"] == "vllm" and settings["model_base_weights"]
