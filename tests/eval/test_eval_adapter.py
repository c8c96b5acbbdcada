"""Evaluating a LoRA adapter directory (PEFT's format with ``mopd_base.json``, as ``mopd export
--adapter`` writes it): the HF engine merges the adapter into the base it names and samples what the
base with PEFT's (unmerged) adapter samples; ``mopd eval run --model ADAPTER_DIR`` runs as with a
full model, its tokenizer and template the base's; an adapter over other weights, or over a base
that is not there, is refused in one line before anything loads."""

import json
import random
import shutil

import pytest
import torch

from mopd.cli import main
from mopd.core.adapter_dir import BASE_FILE
from mopd.core.fingerprint import model_fingerprint
from mopd.core.generation import GenerationRequest, SamplingParams
from mopd.core.qa import QAExample, write_questions
from mopd.core.records import read_records
from mopd.rollout.hf_engine import HFEngine

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def write_adapter(base_dir, out_dir, *, seed, rank=4, alpha=16, base_weights="auto"):
    """A PEFT adapter over ``base_dir`` with random non-zero A and B (it changes the model's output),
    plus ``mopd_base.json`` naming the base by path and weights fingerprint."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, init_lora_weights=False,
                                                  target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"]))
    with torch.no_grad():   # PEFT's random B is small; make the adapter tell in greedy tokens
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.5)
    peft_model.save_pretrained(out_dir)
    weights = model_fingerprint(base_dir)["weights"] if base_weights == "auto" else base_weights
    (out_dir / BASE_FILE).write_text(json.dumps({"path": str(base_dir), "weights": weights}))
    return out_dir


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from tests.helpers.tiny_model import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=32, layers=2, heads=2, ffn=64,
                           max_positions=4096, seed=3)


@pytest.fixture(scope="module")
def adapter(base, tmp_path_factory):
    return write_adapter(base, tmp_path_factory.mktemp("adapter") / "a", seed=7)


def greedy(engine, seed, n=5, new_tokens=10):
    rng = random.Random(seed)
    reqs = [GenerationRequest([rng.randrange(5, 300) for _ in range(rng.randint(2, 17))],
                              SamplingParams(temperature=0.0, max_new_tokens=new_tokens)) for _ in range(n)]
    return [o[0].token_ids for o in engine.generate(reqs)]


def test_the_hf_engine_merges_an_adapter_dir_into_its_base_and_samples_as_peft_does(base, adapter):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    merged = HFEngine.from_pretrained(str(adapter), device="cpu", prefix_cache_mb=0)
    assert not any("lora_" in n for n, _ in merged.model.named_parameters())   # a plain model
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), str(adapter))
    tok = AutoTokenizer.from_pretrained(base)
    reference = HFEngine(peft.eval(), tok, prefix_cache_mb=0)
    plain = HFEngine.from_pretrained(str(base), device="cpu", prefix_cache_mb=0)
    ours = greedy(merged, seed=1)
    assert ours == greedy(reference, seed=1)
    assert ours != greedy(plain, seed=1)                     # the adapter was applied, not ignored
    assert merged.tokenizer.get_vocab() == tok.get_vocab()  # the base's tokenizer


class _Passage:
    def __init__(self, i, q):
        self.id, self.title, self.text, self.score = f"{q}#{i}", f"T{i}", f"passage {i} about {q}", 0.0


class _Retriever:
    def search(self, queries, k):
        return [[_Passage(i, q) for i in range(k)] for q in queries]


def eval_args(model, manifest, out):
    return ["eval", "run", "--model", str(model), "--workflow", "cmas", "--manifest", str(manifest),
            "--attempts", "1", "--out", str(out), "rollout.max_output_tokens=6", "rollout.max_steps=2",
            "retriever.index=bundled"]


@pytest.fixture
def manifest(tmp_path, monkeypatch):
    import mopd.retriever

    monkeypatch.setattr(mopd.retriever, "load_retriever", lambda cfg: _Retriever())
    path = tmp_path / "test.jsonl"
    write_questions(path, [QAExample(f"q{i}", "nq", f"Where was band {i} formed?", ["Paris"]) for i in range(2)])
    return path


def test_eval_run_takes_an_adapter_dir_and_records_the_adapter_and_its_base(base, adapter, manifest, tmp_path):
    out = tmp_path / "run"
    assert main(eval_args(adapter, manifest, out)) == 0
    recs = read_records(out / "records.jsonl")
    assert sorted(r.question_id for r in recs) == ["q0", "q1"] and all(r.output_tokens > 0 for r in recs)
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["model_weights"] == model_fingerprint(adapter)["weights"]    # the adapter's tensors
    assert settings["model_base_weights"] == model_fingerprint(base)["weights"]
    assert settings["model_chat_template"] == model_fingerprint(base)["chat_template"]


def test_an_adapter_over_other_weights_or_a_missing_base_is_refused_in_one_line(base, adapter, manifest, tmp_path,
                                                                                  capsys):
    other = write_adapter(base, tmp_path / "other", seed=8, base_weights="0" * 32)
    capsys.readouterr()
    assert main(eval_args(other, manifest, tmp_path / "r1")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mopd eval: error: --model ")
    assert "adapter over another base model" in err and len(err.splitlines()) == 1

    moved = tmp_path / "moved"
    shutil.copytree(adapter, moved)
    (moved / BASE_FILE).write_text(json.dumps({"path": str(tmp_path / "gone"), "weights": None}))
    assert main(eval_args(moved, manifest, tmp_path / "r2")) == 2
    err = capsys.readouterr().err.strip()
    assert "is not a model directory here" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r1" / "records.jsonl").exists() and not (tmp_path / "r2" / "records.jsonl").exists()
