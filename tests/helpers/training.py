"""A deterministic in-memory retriever with the project's retriever interface."""

from mopd.retriever import Passage


class FakeRetriever:
    def __init__(self, fail_after=None):
        self.calls = 0
        self.fail_after = fail_after

    def search(self, queries, k):
        from mopd.retriever import RetrieverUnavailable

        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RetrieverUnavailable("http://127.0.0.1:1 (test): connection refused")
        return [[Passage(id=f"{abs(hash(q)) % 97}-{j}", title=f"T{j}", text=f"town {j} text", score=1.0 - j / 10)
                 for j in range(k)] for q in queries]


def tiny_overrides(model_dir, qa_file, out_dir, **extra):
    o = {
        "model.path": model_dir, "data.train": qa_file, "trainer.out_dir": str(out_dir),
        "trainer.steps": 2, "trainer.questions_per_step": 2, "trainer.ppo_minibatches": 2,
        "trainer.micro_batch_tokens": 600, "trainer.lr": 1e-3, "trainer.val_every": 0,
        "trainer.checkpoint_every": 0, "rollout.group_size": 2, "rollout.answer_candidates": 2,
        "rollout.max_output_tokens": 12, "rollout.max_steps": 2, "rollout.max_rounds": 2,
        "rollout.max_input_tokens": 2048,
    }
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]
