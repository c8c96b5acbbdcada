"""Has a stage run again? Compare the stamps of the files it writes (no timing involved)."""

BUILT = ("world/world.json", "world/corpus.jsonl", "pi0/pi0.json", "pi0/model.safetensors", "pi0_check.json",
         "stage1/metrics.jsonl", "stage1/export/model.safetensors", "stage1/DONE",
         "stage2/metrics.jsonl", "stage2/export/model.safetensors", "stage2/DONE")
"""What each stage writes when it runs: a reused stage leaves its files untouched."""


def stamps(root, rels=BUILT):
    """Modification time and size of each built file: a stage that ran again rewrites its files."""
    return {rel: ((root / rel).stat().st_mtime_ns, (root / rel).stat().st_size) for rel in rels}
