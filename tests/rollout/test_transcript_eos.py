"""The transcript stops where the engine stops: a model turn that ended on any of the engine's EOS
ids (the generation config's, not only the tokenizer's) is closed by the template once, not twice."""

from mopd.core.generation import Completion
from mopd.core.records import AgentCall
from mopd.rollout import prompts
from mopd.rollout.engine import eos_ids_of, model_dir_eos_ids
from mopd.rollout.run_state import WorkflowSettings
from mopd.rollout.transcript import Transcript


def _turn(tokenizer, text, end_id):
    ids = tokenizer.encode(text, add_special_tokens=False) + [end_id]
    return Completion(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", text=text)


def test_a_turn_ended_on_a_second_eos_id_is_closed_once(tokenizer):
    # A Qwen3 base tokenizer's EOS is <|endoftext|> while its chat turns end on <|im_end|>, which
    # only the generation config lists.
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    prompt = prompts.render_searcher_prompt(tokenizer, "Where was band 3 formed?")
    for eos_ids, doubled in (({endoftext, im_end}, False), ({endoftext}, True)):
        t = Transcript(AgentCall(call_id="s0", role="searcher"), tokenizer, 4096, eos_ids=eos_ids)
        t.start(prompt)
        t.add_model_turn(_turn(tokenizer, "<search>band 3</search>", im_end))
        assert t.append_env("<information>Doc 1(Title: T) x</information>")
        text = t.call.segments[-1].text
        assert text.startswith("<|im_end|>") == doubled
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_the_engine_eos_ids_reach_the_settings():
    class Engine:
        eos_ids = {7, 3}

    s = WorkflowSettings()
    assert s.with_engine(Engine()).eos_ids == (3, 7)
    assert WorkflowSettings(eos_ids=(9,)).with_engine(Engine()).eos_ids == (9,)
    assert s.with_engine(object()) is s


def test_eos_ids_of_a_model_directory(tmp_path, tokenizer):
    import json

    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 151643}))
    assert model_dir_eos_ids(str(tmp_path), tokenizer) == {151645, 151643, tokenizer.eos_token_id}
    assert eos_ids_of(tokenizer, None, [4, 5]) == {4, 5, tokenizer.eos_token_id}
