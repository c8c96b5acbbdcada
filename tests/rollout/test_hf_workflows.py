"""Both workflows on HFEngine with the tiny random model: the records are token-exact.

A random model rarely writes a valid action, so some tests steer it with a bigram bias (a fixed
function of the previous token added to the logits, in generation and in re-scoring alike):
after a newline it writes ``<search>band</search>``, which gives real searches, passages and
multi-turn Searcher calls.
"""

import itertools

import pytest
import torch

from mopd.core.records import read_records, write_records
from mopd.rollout.run_state import WorkflowSettings
from mopd.rollout.scheduler import run_workflows
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.workflows import check_call_layout, questions


class BigramSteer:
    """Adds ``strength`` to the logit of ``rules[prev]`` after token ``prev``."""

    def __init__(self, model, rules, strength=30.0):
        vocab = model.config.vocab_size
        self.table = torch.zeros(vocab, vocab)
        for a, b in rules.items():
            self.table[a, b] = strength
        self.ids = None
        self.handles = [
            model.get_input_embeddings().register_forward_hook(lambda m, inp, out: setattr(self, "ids", inp[0])),
            model.lm_head.register_forward_hook(self._bias),
        ]

    def _bias(self, module, inp, out):
        ids = self.ids[:, -out.shape[1]:]
        return out + self.table[ids].to(out.dtype)

    def remove(self):
        for h in self.handles:
            h.remove()


STEER = {
    "search": ["\n", "<search>", "band", "</search>"],
    "subtask": ["\n", "<subtask>", "band", "</subtask>", "<|im_end|>"],
}
"""Token chains the steered model follows: after a newline it writes ``<search>band</search>``
(Searchers search) or ``<subtask>band</subtask><|im_end|>`` (the Leader delegates)."""


@pytest.fixture(params=["search"])
def steered(request, hf_engine, tokenizer):
    def one(text):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) == 1, text
        return ids[0]

    chain = [one(t) for t in STEER[request.param]]
    steer = BigramSteer(hf_engine.model, dict(itertools.pairwise(chain)))
    yield hf_engine
    steer.remove()


def run(engine, tokenizer, workflow, n_questions=3, attempts=2, temperature=1.0, max_active_runs=None, **cfg):
    cfg.setdefault("max_output_tokens", 12)
    settings = WorkflowSettings(workflow=workflow, max_steps=5 if workflow == "cmas" else 8, max_rounds=2,
                                answer_candidates=2, temperature=temperature, seed=5,
                                max_active_runs=max_active_runs or 0, **cfg)
    return run_workflows(engine, FakeRetriever(), tokenizer, questions(n_questions), settings, attempts=attempts,
                         progress=False)


def rescore(model, call, temperature):
    ids = torch.tensor([call.token_ids()])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)[:-1]
    return logp.gather(-1, ids[0, 1:, None]).squeeze(-1)  # log-prob of token t+1 given 0..t


def check_rescoring(model, records, temperature):
    for rec in records:
        for call in rec.calls:
            mask = torch.tensor(call.loss_mask()[1:], dtype=torch.bool)
            got = torch.tensor(call.sampling_logprobs()[1:])[mask]
            torch.testing.assert_close(got, rescore(model, call, temperature)[mask], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("workflow", ["cmas", "hmas"])
def test_recorded_logprobs_are_reproduced_by_re_scoring(hf_engine, tokenizer, workflow):
    records = run(hf_engine, tokenizer, workflow)
    assert len(records) == 6 and all(len(r.candidates) == 2 for r in records)
    check_rescoring(hf_engine.model, records, 1.0)
    for rec in records:
        for call in rec.calls:
            check_call_layout(call, tokenizer)


def test_steered_searches_give_token_exact_multi_turn_calls(steered, tokenizer):
    records = run(steered, tokenizer, "cmas", temperature=0.8)
    searchers = [c for r in records for c in r.calls_of("searcher")]
    # steps 1-3 search; step 4 orders a report, but the steered model searches again: that query is
    # not run, yet it counts as a search action, as the paper counts them
    assert all(r.search_actions == 4 for r in records)
    assert all(sum(e.kind == "search" and not e.passages for e in r.events) == 1 for r in records)
    assert all(s.outputs()[0] == "<search>band</search>" for s in searchers)
    for s in searchers:
        env = [seg for seg in s.segments if seg.source == "env"]
        assert env[1].text.startswith("<|im_end|>\n<|im_start|>user\n<information>Doc 1(Title: T0)")
        check_call_layout(s, tokenizer)
    check_rescoring(steered.model, records, 0.8)


@pytest.mark.parametrize("workflow,steered", [("cmas", "search"), ("hmas", "subtask")], indirect=["steered"])
def test_greedy_runs_batched_equal_runs_one_at_a_time(steered, tokenizer, workflow):
    together = run(steered, tokenizer, workflow, temperature=0.0, n_questions=3, attempts=1)
    alone = run(steered, tokenizer, workflow, temperature=0.0, n_questions=3, attempts=1, max_active_runs=1)
    assert [[c.token_ids() for c in r.calls] for r in together] == [[c.token_ids() for c in r.calls] for r in alone]
    assert [r.to_dict()["events"] for r in together] == [r.to_dict()["events"] for r in alone]
    assert all(r.search_actions > 0 for r in together) if workflow == "cmas" else True


@pytest.mark.parametrize("steered", ["subtask"], indirect=True)
def test_steered_leader_waves_on_the_real_engine(steered, tokenizer):
    records = run(steered, tokenizer, "hmas", temperature=0.7)
    for rec in records:
        # L1 delegates; its Searcher writes subtasks too (invalid) until forced at step 6 and ends
        # without a report; L7 is forced to select, delegates again (invalid): fallback; A8.
        assert [c.call_id for c in rec.calls_of("searcher")] == ["s0.0"] and rec.steps == 8
        assert len(rec.calls[1].outputs()) == 5 and rec.calls[1].invalid
        assert rec.events_of("select")[0].text == "fallback" and rec.events_of("select")[0].selection == [1]
        leader = rec.calls[0]
        assert leader.outputs() == ["<subtask>band</subtask>"] * 2
        assert "Report 1 (task: band)" in leader.segments[2].text
        assert leader.segments[2].text.startswith("\n<|im_start|>user\n")  # after EOS
        for call in rec.calls:
            check_call_layout(call, tokenizer)
    check_rescoring(steered.model, records, 0.7)


def test_hf_records_round_trip(hf_engine, tokenizer, tmp_path):
    records = run(hf_engine, tokenizer, "hmas", n_questions=2, attempts=1)
    write_records(tmp_path / "r.jsonl", records)
    back = read_records(tmp_path / "r.jsonl")
    assert [r.to_dict() for r in back] == [r.to_dict() for r in records]
    assert [c.loss_mask() for c in back[0].calls] == [c.loss_mask() for c in records[0].calls]
