"""LoRA on SmolLM2-135M-Instruct, on the engine of ``MOPD_REAL_ENGINE``:

- a LoRA training step (``model.lora.rank=8``, Stage II ``mopd``) whose teacher, and KL reference,
  is an adapter over the same base (the Stage-I adapter's place; here a random one): the Leader's KL
  term moves the student's adapter from the first step, and only the adapter trains, the base's
  tensors bit-identical; on vLLM the sync sends the adapter alone;
- a LoRA rollout: an adapter directory, loaded by the engine the evaluation builds (vLLM: started
  on the base with a LoRA slot, the adapter loaded; HF: merged into the base), generates greedily
  what the base with PEFT's (unmerged) adapter generates, and not what the base does.
"""

import json
from pathlib import Path

import pytest
import torch

from mopd.config import RolloutConfig, resolve
from mopd.core.adapter_dir import BASE_FILE
from mopd.core.fingerprint import model_fingerprint
from mopd.core.generation import GenerationRequest, SamplingParams
from mopd.rollout.engines import build_engine
from mopd.rollout.hf_engine import HFEngine
from tests.real.support import MAX_INPUT, MAX_OUTPUT, engine, require_real
from tests.real.test_train import train_overrides

require_real()
pytestmark = [pytest.mark.real, pytest.mark.filterwarnings("ignore::UserWarning")]

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_adapter(base_dir, out_dir: Path, *, seed: int, rank: int = 8, b_std: float = 0.02) -> Path:
    """A PEFT adapter over ``base_dir`` (A as PEFT initialises it, B drawn so that it changes the
    model) with ``mopd_base.json``, as ``mopd export --adapter`` writes one."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                                  target_modules=TARGETS))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, b_std)
    peft_model.save_pretrained(out_dir)
    (out_dir / BASE_FILE).write_text(json.dumps({"path": str(base_dir),
                                                 "weights": model_fingerprint(base_dir)["weights"]}))
    return out_dir


def test_a_lora_step_with_an_adapter_teacher_trains_the_adapter_alone(real_model, quick_world, tmp_path):
    from mopd.train import lora
    from mopd.train.trainer import PolicyTrainer

    teacher = write_adapter(real_model, tmp_path / "teacher", seed=1)
    overrides = [*train_overrides(real_model, quick_world, tmp_path / "run", "hmas"), "model.lora.rank=8",
                 "model.lora.alpha=16", "trainer.lr=1e-3", f"teacher.path={teacher}"]
    t = PolicyTrainer(resolve("mopd", overrides), progress=False)
    try:
        base = {k: v.detach().clone() for k, v in t.model.state_dict().items() if ".lora_" not in k}
        trainable = [n for n, p in t.model.named_parameters() if p.requires_grad]
        t.fit(1)
        assert trainable and all(".lora_" in n and f".{lora.STUDENT}." in n for n in trainable)
        assert sum(len(g["params"]) for g in t.optimizer.param_groups) == len(trainable)   # AdamW: adapters only
        after = t.model.state_dict()
        assert all(torch.equal(v, after[k]) for k, v in base.items())       # the base, bit for bit
        student = lora.adapter_state_dict(t.model)
        assert any("lora_B" in k and v.abs().max() > 0 for k, v in student.items())   # moved off B = 0
        row = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
               if "perf/sync_mbytes" in x][-1]
        assert row["loss/leader_kl"] > 0                                    # the adapter teacher is not the base
        adapter_mb = sum(v.numel() * v.element_size() for v in student.values()) / 2 ** 20
        if engine() == "vllm":
            assert row["perf/sync_adapter_only"] == 1 and row["perf/sync_mbytes"] == pytest.approx(adapter_mb)
            assert row["perf/sync_mbytes"] < 0.1 * sum(v.numel() * v.element_size() for v in base.values()) / 2 ** 20
    finally:
        t.close()


def greedy(eng, prompts, new_tokens=16):
    return [o[0].token_ids for o in eng.generate(
        [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=new_tokens)) for p in prompts])]


def test_a_lora_rollout_generates_what_the_base_with_pefts_adapter_does(real_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = write_adapter(real_model, tmp_path / "adapter", seed=2)
    tok = AutoTokenizer.from_pretrained(real_model)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False)
               for q in ("Where was the band Radiohead formed?", "Name a river that flows through Paris.",
                         "Who wrote the novel Dracula?")]
    eng = build_engine(RolloutConfig(engine=engine(), max_input_tokens=MAX_INPUT, max_output_tokens=MAX_OUTPUT,
                                     seed=3), str(adapter), dtype="float32", device="cpu")
    try:
        if engine() == "vllm":
            assert eng.lora_request is not None                            # the adapter, unmerged, in vLLM
        ours = greedy(eng, prompts)
    finally:
        if hasattr(eng, "close"):
            eng.close()
    base = AutoModelForCausalLM.from_pretrained(real_model, dtype=torch.float32)
    peft = HFEngine(PeftModel.from_pretrained(base, str(adapter)).eval(), tok, prefix_cache_mb=0)
    assert ours == greedy(peft, prompts)
    plain = HFEngine.from_pretrained(real_model, dtype="float32", device="cpu", prefix_cache_mb=0)
    assert ours != greedy(plain, prompts)                                  # the adapter told
