"""Config overrides of a tiny, fast training run (tests of the trainer)."""


def tiny_overrides(model_dir, qa_file, out_dir, **extra):
    o = {
        "model.path": model_dir, "data.train": qa_file, "trainer.out_dir": str(out_dir),
        "trainer.steps": 2, "trainer.questions_per_step": 2, "trainer.ppo_minibatches": 2,
        "trainer.micro_batch_tokens": 600, "trainer.lr": 1e-3, "trainer.val_every": 0,
        "trainer.checkpoint_every": 0, "rollout.group_size": 2, "rollout.answer_candidates": 2,
        "rollout.max_output_tokens": 12, "rollout.max_steps": 2, "rollout.max_rounds": 2,
        "rollout.max_input_tokens": 2048,
        # a random model writes no valid action, so every step has no learning signal: runs of the
        # trainer's mechanics must not stop for it (tests/train/test_learning_signal.py sets it)
        "trainer.max_signalless_steps": 0,
    }
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]
