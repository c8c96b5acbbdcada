"""An adapter directory over a model directory, written as `mopd export --adapter` writes one, with
random (non-zero) B matrices so that it changes what the model computes."""

from __future__ import annotations

from pathlib import Path


def write_random_adapter(base: str, out: Path, *, rank: int = 4, targets=("q_proj", "v_proj"), std: float = 0.05,
                         seed: int = 0) -> str:
    import torch

    from mopd.core.run_models import Adapters, RunModels
    from mopd.train import lora
    from mopd.train.model import load_causal_lm

    model, _ = load_causal_lm(base, dtype=torch.float32, device=torch.device("cpu"))
    a = Adapters(rank, 2.0 * rank, 0.0, tuple(targets))
    lora.add_adapters(model, a, base)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    lora.write_adapter_dir(Path(out), lora.adapter_state_dict(model), a, RunModels(base, a, ()).base_record)
    return str(out)
