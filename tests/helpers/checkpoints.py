"""A tiny model and optimizer with real weights to checkpoint, and a step that changes them."""

import torch


def model_and_optimizer(model_dir):
    """The tiny model (fp32, seeded) and an AdamW over it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def train_a_bit(m, opt, seed):
    """One optimizer step on random tokens: every checkpoint after it holds other weights."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, m.config.vocab_size, (2, 7), generator=g)
    m(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
