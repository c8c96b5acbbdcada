"""A dry run loads and runs nothing: every loader and launcher a pipeline stage uses, made to fail."""

from __future__ import annotations


def refuse(*a, **k):
    raise AssertionError("a dry run loaded or ran something")


def refuse_loading(monkeypatch, *extra) -> None:
    """Make the core's loaders and launchers (and each ``(module, name)`` of ``extra``) fail the test
    when called."""
    import transformers

    import mopd.core.qa
    import mopd.eval.runner
    import mopd.pipeline.run
    import mopd.retriever
    import mopd.train.trainer

    monkeypatch.setattr(mopd.train.trainer.PolicyTrainer, "__init__", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    for module, name in ((mopd.retriever, "load_retriever"), (mopd.eval.runner, "evaluate"),
                         (mopd.core.qa, "load_questions"), (mopd.pipeline.run.subprocess, "call"), *extra):
        monkeypatch.setattr(module, name, refuse)
