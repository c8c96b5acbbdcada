"""Per-call limits against the model's context: clamped with a notice, or refused naming the keys,
before any engine starts (`mopd eval run` and `mopd train` both call fit_context first)."""

import json

import pytest

from mopd.config import resolve
from mopd.core.errors import UserError
from mopd.rollout.context import fit_context, fit_limits, model_context


def _model_dir(tmp_path, config, tokenizer_config=None):
    d = tmp_path / "m"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    if tokenizer_config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return d


def test_the_context_is_the_smaller_of_positions_and_the_tokenizer_limit(tmp_path):
    d = _model_dir(tmp_path, {"max_position_embeddings": 8192}, {"model_max_length": 6000})
    assert model_context(str(d)) == (6000, "model_max_length in tokenizer_config.json")
    d2 = _model_dir(tmp_path / "b", {"text_config": {"max_position_embeddings": 3000}},
                    {"model_max_length": 1000000000000000019884624838656})   # transformers' "not set"
    assert model_context(str(d2)) == (3000, "max_position_embeddings in config.json")
    assert model_context(str(tmp_path / "none")) == (None, "")


@pytest.mark.parametrize("inp, out, ctx, want", [(8192, 512, 8192, 7680), (1000, 24, 1025, 1000),
                                                  (5000, 333, 4097, 3764)])
def test_an_input_limit_past_the_context_is_clamped_with_a_notice(inp, out, ctx, want):
    limit, notice = fit_limits(inp, out, ctx, "max_position_embeddings in config.json")
    assert limit == want and limit + out <= ctx
    assert (notice == "") == (inp + out <= ctx)
    if notice:
        assert f"{inp} clamped to {want}" in notice and f"context is {ctx}" in notice and "\n" not in notice


def test_an_output_limit_that_leaves_no_prompt_is_refused_naming_the_keys():
    with pytest.raises(UserError, match="rollout.max_output_tokens=4090 leaves 6 of the model's 4096"):
        fit_limits(100, 4090, 4096, "max_position_embeddings in config.json")


def test_fit_context_changes_only_the_input_limit(tmp_path):
    d = _model_dir(tmp_path, {"max_position_embeddings": 8192})
    cfg = resolve("cmas_rl", [f"model.path={d}"])
    said = []
    fitted = fit_context(cfg, str(d), log=said.append)
    assert fitted.rollout.max_input_tokens == 8192 - cfg.rollout.max_output_tokens
    assert fitted.rollout.max_output_tokens == cfg.rollout.max_output_tokens
    assert len(said) == 1 and "clamped to 7680" in said[0]
    # The engine is sized from the fitted limits: vLLM's max_model_len is input + output.
    assert fitted.rollout.max_input_tokens + fitted.rollout.max_output_tokens == 8192
    assert fit_context(fitted, str(d), log=said.append) is fitted and len(said) == 1


def test_eval_run_clamps_before_the_engine_starts(tmp_path, tiny_dir, monkeypatch, capsys):
    """`mopd eval run` on a model whose context is shorter than the limits: one notice line, and the
    engine is built with the fitted limits."""
    import shutil

    import mopd.rollout.engines as engines
    from mopd.cli import main
    from mopd.core.qa import QAExample, write_questions

    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    conf = json.loads((model / "config.json").read_text())
    conf["max_position_embeddings"] = 1000
    (model / "config.json").write_text(json.dumps(conf))
    seen = []

    def no_engine(rollout_cfg, path, **kw):
        seen.append((rollout_cfg.max_input_tokens, rollout_cfg.max_output_tokens))
        raise UserError("stopped here")

    monkeypatch.setattr(engines, "build_engine", no_engine)
    manifest = tmp_path / "q.jsonl"
    write_questions(manifest, [QAExample("q0", "toy", "Where?", ["Oslo"])])
    code = main(["eval", "run", "--preset", "tiny_cmas_rl", "--workflow", "cmas", "--model", str(model), "--manifest", str(manifest),
                 "--out", str(tmp_path / "out"), "rollout.max_input_tokens=2048", "rollout.max_output_tokens=40"])
    assert code != 0
    out = capsys.readouterr()
    assert seen == [(960, 40)]
    assert "rollout.max_input_tokens 2048 clamped to 960: the model's context is 1000" in out.out + out.err
