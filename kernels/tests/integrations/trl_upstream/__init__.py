"""TRL's own GRPOTrainer tests (trl 0.23.1's tests/test_grpo_trainer.py, vendored unchanged, Apache-2.0)
run against FusedGRPOTrainer: conftest.py swaps the trainer and serves the hub ids they load from
tiny models and datasets built here (the hub is not reachable)."""
