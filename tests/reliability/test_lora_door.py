"""LoRA through the command line a user types (issue 58): a LoRA run resumes with its own arguments
bit for bit, Stage II takes the Stage-I adapter as its teacher, and bad LoRA inputs are one line
before anything loads."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from mopd.cli import main
from tests.reliability.indexes import bm25_index


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from tests.helpers.tiny_model import init_tiny_model

    root = tmp_path_factory.mktemp("lora_door")
    model = init_tiny_model(root / "base", vocab_size=400, hidden=32, layers=1, heads=2, ffn=64, seed=0)
    qa = root / "train.jsonl"
    import json

    qa.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Where was band {i} formed?",
                                      "golden_answers": [f"town {i % 3}"]}) + "\n" for i in range(8)))
    index = bm25_index(root / "retrieval")
    return {"root": root, "model": str(model), "qa": str(qa), "index": str(index)}


def run_args(w, preset, out, *extra):
    return [preset, f"model.path={w['model']}", f"data.train={w['qa']}", f"trainer.out_dir={out}",
            "retriever.kind=inprocess", f"retriever.index={w['index']}", "trainer.questions_per_step=2",
            "rollout.group_size=2", "rollout.answer_candidates=2", "rollout.max_output_tokens=8",
            "trainer.max_signalless_steps=0", "trainer.checkpoint_every=1", "trainer.val_every=0",
            "model.lora.rank=4", "model.lora.target_modules=[q_proj,v_proj,down_proj]", *extra]


def adapter_of_run(run, out):
    assert main(["export", str(run), "--checkpoint", "latest", "--adapter", "--out", str(out)]) == 0
    return load_file(str(out / "adapter_model.safetensors"))


@pytest.mark.slow
def test_a_lora_run_resumes_from_the_cli_bit_exactly_and_its_adapter_teaches_stage_two(world, capsys):
    root = world["root"]
    resumed, straight = root / "resumed", root / "straight"
    assert main(["train", "--steps", "2", *run_args(world, "tiny_cmas_rl", resumed)]) == 0
    # the same command with --resume: every list-valued setting given again as typed
    assert main(["train", "--steps", "3", "--resume", *run_args(world, "tiny_cmas_rl", resumed)]) == 0, \
        capsys.readouterr().err
    assert main(["train", "--steps", "3", *run_args(world, "tiny_cmas_rl", straight)]) == 0
    a, b = adapter_of_run(resumed, root / "a_resumed"), adapter_of_run(straight, root / "a_straight")
    assert a.keys() == b.keys() and len(a) == 6   # lora_A and lora_B of three modules
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.endswith("lora_B.weight") and a[k].abs().sum() > 0 for k in a)   # it trained
    # Stage II over the same base with that adapter as teacher (and KL reference), from another directory
    cwd = os.getcwd()
    os.chdir(root / "a_resumed")
    try:
        assert main(["train", "--steps", "1", *run_args(world, "tiny_mopd", root / "stage2",
                                                         f"teacher.path={root / 'a_resumed'}")]) == 0, \
            capsys.readouterr().err
    finally:
        os.chdir(cwd)
    assert (root / "stage2" / "checkpoints").is_dir()


def _one_line(capsys, argv, *needles):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2, err
    for n in needles:
        assert n in err, err
    return err


@pytest.mark.parametrize("extra, needle", [
    (["model.lora.target_modules=[q_proj,v_proj,down_prj]"], "down_prj matches no module of the model (closest: "
                                                             "down_proj"),
    (["model.lora.target_modules=[embed_tokens]"], "embed_tokens is tied to the lm head"),
    (["model.lora.rank=33"], "model.lora.rank=33 is over the width"),
    (["model.lora.target_modules=[all-linear,q_proj]"], "all-linear already names every linear layer"),
])
def test_lora_settings_the_model_cannot_take_are_one_line_before_loading(world, tmp_path, capsys, extra, needle):
    _one_line(capsys, ["train", *run_args(world, "tiny_cmas_rl", tmp_path / "r", *extra)], "mopd train: error:",
              needle)
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_an_adapter_teacher_that_does_not_exist_or_is_cut_is_one_line(world, tmp_path, capsys):
    _one_line(capsys, ["train", *run_args(world, "tiny_mopd", tmp_path / "r", f"teacher.path={tmp_path}/s1/adapter")],
              "teacher.path=", "does not exist")
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4, "base_model_name_or_path": "x"}')
    (cut / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    _one_line(capsys, ["train", *run_args(world, "tiny_mopd", tmp_path / "r", f"teacher.path={cut}")],
              "teacher.path", "adapter_model.safetensors")


def test_exporting_the_adapter_of_a_lora_run_without_a_checkpoint_says_so(world, tmp_path, capsys):
    from mopd.config import resolve
    from mopd.train.run_dir import prepare_run_dir

    out = tmp_path / "fresh"
    prepare_run_dir(resolve("tiny_cmas_rl", run_args(world, "tiny_cmas_rl", out)[1:]), resume=False)
    err = _one_line(capsys, ["export", str(out), "--adapter", "--out", str(tmp_path / "x")], "no checkpoint yet")
    assert "trained all weights" not in err
