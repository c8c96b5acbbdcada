"""`mopd eval run`, C-MAS and H-MAS, on SmolLM2-135M-Instruct under every chat template of the
families users train (tests.helpers.chat_templates), with every call checked token-exactly.

On the HF engine every template runs; on vLLM (``MOPD_REAL_ENGINE=vllm``, in .venv-vllm) the model's
own ChatML and the two Qwen3 templates that differ most from it, to keep the tier's time: what the
engine adds (stop strings, EOS ids, sampled ids and log-probs) does not depend on the template."""

import pytest
from transformers import AutoTokenizer

from mopd.cli import main
from mopd.core.records import read_records
from mopd.core.roles import ROLE_TABLE
from mopd.rollout.engine import model_dir_eos_ids
from tests.helpers.chat_templates import STABLE_HISTORY, TEMPLATES
from tests.real.exactness import check_records
from tests.real.support import LIMITS, MAX_INPUT, MAX_OUTPUT, PRESET, engine, engine_overrides, require_real, \
    template_overrides

require_real()
pytestmark = pytest.mark.real

VLLM_TEMPLATES = ("chatml", "qwen3_hybrid", "qwen3_2507_thinking")
NAMES = list(TEMPLATES) if engine() == "hf" else list(VLLM_TEMPLATES)
QUESTIONS = 2


def check_turn_ends(records, tokenizer, eos_ids) -> None:
    """Every model turn ends where the engine had to stop it: on an EOS id, on its role's stop string
    (completed by the last token), or at the output limit; never past one of them."""
    for r in records:
        for c in r.calls:
            stops = ROLE_TABLE[c.role].stop
            turns = [s for s in c.segments if s.source == "model"]
            assert len(turns) == len(c.finish_reasons)
            for seg, why in zip(turns, c.finish_reasons):
                ids = seg.token_ids
                before = tokenizer.decode(ids[:-1])
                assert not any(i in eos_ids for i in ids[:-1]), (c.call_id, "an EOS id inside a turn")
                assert not any(s in before for s in stops), (c.call_id, "ran past a stop string", before)
                if why == "length":
                    assert len(ids) == MAX_OUTPUT, (c.call_id, len(ids))
                else:
                    assert why == "stop", (c.call_id, why)
                    text = tokenizer.decode(ids)
                    assert ids[-1] in eos_ids or any(s in text for s in stops), (c.call_id, text)


@pytest.fixture(scope="module")
def runs(template_models, quick_world, tmp_path_factory):
    """(template, workflow) -> (model directory, records, printed output), each run once, on demand."""
    done = {}

    def run(name, workflow, capsys):
        if (name, workflow) not in done:
            model = template_models[name]
            out = tmp_path_factory.mktemp(f"{name}-{workflow}")
            args = ["eval", "run", "--model", model, "--workflow", workflow, "--preset", PRESET[workflow],
                    "--manifest", str(quick_world.test), "--attempts", "1", "--limit", str(QUESTIONS),
                    "--keep-token-ids", "--out", str(out / "eval"), f"retriever.index={quick_world.index}",
                    f"rollout.max_output_tokens={MAX_OUTPUT}", f"rollout.max_input_tokens={MAX_INPUT}",
                    *LIMITS[workflow], *engine_overrides(), *template_overrides(TEMPLATES[name][1])]
            assert main(args) == 0
            done[name, workflow] = (model, read_records(out / "eval" / "records.jsonl"), capsys.readouterr().out)
        return done[name, workflow]

    return run


@pytest.mark.parametrize("workflow", ["cmas", "hmas"])
@pytest.mark.parametrize("name", NAMES)
def test_eval_run_is_token_exact_under_the_template(name, workflow, runs, capsys):
    model, records, printed = runs(name, workflow, capsys)
    assert len(records) == QUESTIONS and {r.workflow for r in records} == {workflow}
    roles = {c.role for r in records for c in r.calls}
    assert roles == ({"searcher", "answerer"} if workflow == "cmas" else {"leader", "answerer"} | (roles & {"searcher"}))
    assert "format validity:" in printed   # a user checking a new model reads this line
    tokenizer = AutoTokenizer.from_pretrained(model)
    eos_ids = model_dir_eos_ids(model, tokenizer)
    n = check_records(records, tokenizer, eos_ids, TEMPLATES[name][1], whole=name in STABLE_HISTORY)
    assert n >= 2 * QUESTIONS
    # multi-turn calls are where the templates differ: an H-MAS Leader always has one (its first
    # turn cannot select, having no report yet: it is re-asked, or reads its wave's reports)
    if workflow == "hmas":
        leaders = [c for r in records for c in r.calls if c.role == "leader"]
        assert leaders and all(sum(s.source == "model" for s in c.segments) >= 2 for c in leaders)
    check_turn_ends(records, tokenizer, eos_ids)
