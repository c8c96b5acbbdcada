"""Scripted H-MAS runs for the viewer: two systems' evaluation directories laid out as the pipeline
writes them (``<root>/eval/<system>/records.jsonl`` and ``run.json``), and a training run
directory with token traces."""

import pytest
import torch

from tests.helpers.scripted_hmas import scripted_records, write_eval_dirs


@pytest.fixture(scope="session")
def view_model_dir(tmp_path_factory):
    from tests.helpers.tiny_model import init_tiny_model

    return str(init_tiny_model(tmp_path_factory.mktemp("view_model") / "model"))


@pytest.fixture(scope="session")
def view_tokenizer(view_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(view_model_dir)


@pytest.fixture(scope="session")
def eval_root(tmp_path_factory, view_tokenizer, view_model_dir):
    """``runs/demo``-like: eval/opd and eval/control, each records.jsonl + run.json naming the model."""
    return write_eval_dirs(tmp_path_factory.mktemp("demo"), view_tokenizer, view_model_dir)


@pytest.fixture(scope="session")
def traced_run(tmp_path_factory, view_tokenizer, view_model_dir):
    """A training run directory whose traces.jsonl holds two steps of the scripted workflows, with
    known values: old = sampling - 0.5, teacher = old + 1 on Searcher tokens and 1 elsewhere."""
    from mopd.algo.advantages import role_specs
    from mopd.config import resolve
    from mopd.train.step_batches import pack_records
    from mopd.train.token_trace import append_traces, trace_lines

    run = tmp_path_factory.mktemp("run")
    (run / "config.yaml").write_text(f"model:\n  path: {view_model_dir}\n")
    cfg = resolve("mopd")
    for step_no in (5, 10):
        records = scripted_records(view_tokenizer, "opd")
        step = pack_records(records, 4096, device=torch.device("cpu"))
        for b in step.batches:
            b.old_logp = b.sampling_logp - 0.5
            b.teacher_logp = b.old_logp + 1.0
        advantages = [{c.call_id: 0.5 for c in r.calls if c.role != "searcher"} for r in records]
        step.fill_advantages(advantages)
        append_traces(run, trace_lines(step_no, records, step, role_specs(cfg.algo), rewards=advantages,
                                       advantages=advantages, teacher_roles=["searcher"], count=3))
    return run
