"""`mopd train` refuses bad inputs and mixed run directories with one line, before loading a model
(at the command line, and the listed inputs)."""

import json
import socket

import pytest

from mopd.cli import main


def _train(capsys, *argv):
    rc = main(["train", *argv])
    err = capsys.readouterr().err.strip()
    return rc, err


def _args(model, data, out, preset="tiny_cmas_rl", *extra):
    return [preset, f"model.path={model}", f"data.train={data}", f"trainer.out_dir={out}", *extra]


def _one_line(rc, err, *needles):
    assert rc == 2, err
    assert err.startswith("mopd train: error: ") and "\n" not in err and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


def test_fresh_train_in_a_directory_with_checkpoints_is_refused(tiny_model_dir, qa_file, tmp_path, capsys):
    out = tmp_path / "r"
    (out / "checkpoints" / "step_000004").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 4}\n')
    _one_line(*_train(capsys, *_args(tiny_model_dir, qa_file, out)), "already holds a run", "--overwrite")
    assert (out / "metrics.jsonl").read_text() == '{"step": 4}\n'


def test_resume_with_another_preset_is_refused_with_the_differences(tiny_model_dir, qa_file, tmp_path, capsys):
    from mopd.config import resolve
    from mopd.train.run_dir import prepare_run_dir

    out = tmp_path / "r"
    prepare_run_dir(resolve("tiny_cmas_rl", _args(tiny_model_dir, qa_file, out)[1:]), resume=False)
    rc, err = _train(capsys, "--resume", *_args(tiny_model_dir, qa_file, out, "tiny_outcome_searcher",
                                                f"teacher.path={tiny_model_dir}"))
    _one_line(rc, err, "method: tiny_cmas_rl -> tiny_outcome_searcher", "--allow-changed")
    assert json.loads((out / "run.json").read_text())["config"]["method"] == "tiny_cmas_rl"


@pytest.mark.parametrize("argv,option", [(["train", "tiny_cmas_rl", "trainer.steps=3", "--resume"], "--resume"),
                                         (["train", "tiny_cmas_rl", "--steps=3"], "--steps"),
                                         (["eval", "run", "--model", "m", "rollout.seed=1", "--limit", "3"], "--limit"),
                                         (["config", "show", "tiny_cmas_rl", "--file", "x.yaml"], "--file")])
def test_option_after_the_preset_says_options_go_before_it(capsys, argv, option):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err
    assert f"error: {option} comes after the preset or the overrides; options go before them" in err
    assert main(["config", "show", "tiny_cmas_rl", "--trainer.steps", "4"]) == 0   # a --key override still works


def test_allow_changed_needs_resume(tiny_model_dir, qa_file, tmp_path, capsys):
    _one_line(*_train(capsys, "--allow-changed", "trainer.steps", "--",
                      *_args(tiny_model_dir, qa_file, tmp_path / "r")), "only applies with --resume")


@pytest.mark.parametrize("path,message", [("''", "model.path is empty"), ("'  '", "model.path is empty"),
                                          ("runs/nowhere/pi0", "model.path=runs/nowhere/pi0 does not exist")])
def test_empty_or_missing_model_path(qa_file, tmp_path, capsys, path, message):
    _one_line(*_train(capsys, *_args(path, qa_file, tmp_path / "r")), message)
    assert not (tmp_path / "r").exists()


def test_model_path_that_is_not_a_model_directory(qa_file, tmp_path, capsys):
    (tmp_path / "m").mkdir()
    _one_line(*_train(capsys, *_args(tmp_path / "m", qa_file, tmp_path / "r")), "no config.json")


def test_empty_training_set(tiny_model_dir, tmp_path, capsys):
    empty = tmp_path / "train.jsonl"
    empty.write_text("")
    _one_line(*_train(capsys, *_args(tiny_model_dir, empty, tmp_path / "r")), "holds no questions")
    assert not (tmp_path / "r").exists()


def test_non_utf8_training_set(tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "train.jsonl"
    bad.write_bytes(b'{"id": "q1", "question": "caf\xe9?", "golden_answers": ["x"]}\n')
    _one_line(*_train(capsys, *_args(tiny_model_dir, bad, tmp_path / "r")), "not UTF-8")


def test_unreachable_retriever_at_start(tiny_model_dir, qa_file, tmp_path, capsys):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rc, err = _train(capsys, *_args(tiny_model_dir, qa_file, tmp_path / "r", "tiny_cmas_rl", "retriever.kind=http",
                                    f"retriever.url=http://127.0.0.1:{port}", "retriever.timeout_s=2"))
    _one_line(rc, err, "retriever.url", f"127.0.0.1:{port}")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("preset", ["cmas_rl", "mopd"])
def test_a_run_without_a_retriever_is_refused_not_given_the_bundled_corpus(tiny_model_dir, qa_file, tmp_path,
                                                                           capsys, preset):
    extra = [f"teacher.path={tiny_model_dir}"] if preset == "mopd" else []
    extra.append("trainer.questions_per_step=8")   # the paper preset's 32 is past the test file's 8 questions
    _one_line(*_train(capsys, *_args(tiny_model_dir, qa_file, tmp_path / "r", preset, *extra)),
              "no retriever", "retriever.index", "retriever.url", "retriever.index=bundled")
    assert not (tmp_path / "r").exists()


def test_bundled_passes_preflight_only_when_asked_for(tiny_model_dir, qa_file):
    from mopd.config import resolve
    from mopd.train.preflight import PreflightError, check_retriever

    check_retriever(resolve("cmas_rl", ["retriever.index=bundled"]).retriever)
    check_retriever(resolve("tiny_cmas_rl").retriever)              # the tiny presets ask for it
    with pytest.raises(PreflightError, match="retriever.index=DIR"):
        check_retriever(resolve("tiny_cmas_rl", ["retriever.index="]).retriever)


def test_missing_index_directory(tiny_model_dir, qa_file, tmp_path, capsys):
    _one_line(*_train(capsys, *_args(tiny_model_dir, qa_file, tmp_path / "r", "tiny_cmas_rl",
                                     f"retriever.index={tmp_path / 'noindex'}")), "is not a directory")


def test_failed_fresh_start_leaves_the_directory_free(tiny_model_dir, qa_file, tmp_path, capsys):
    import shutil

    from mopd.core.run_lock import LOCK_FILE

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3"}')   # no weights: fails while loading
    shutil.copy(f"{tiny_model_dir}/tokenizer.json", model)
    out = tmp_path / "r"
    for _ in range(2):                                              # the second start is not refused
        _one_line(*_train(capsys, *_args(model, qa_file, out)), "cannot load model")
        assert not out.exists() or not any(p.name != LOCK_FILE for p in out.iterdir())
