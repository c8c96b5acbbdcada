import torch

from mopd.train.model import PackedCausalLM, load_causal_lm
from mopd.train.packing import build_packed_batch


def test_packed_forward_logprobs_equal_unpacked(tiny_model_dir):
    model, _ = load_causal_lm(tiny_model_dir, dtype=torch.float32, device=torch.device("cpu"))
    model.eval()
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    seqs = [torch.randint(0, V, (n,), generator=g).tolist() for n in (7, 19, 2, 33)]
    zeros = [[0] * len(s) for s in seqs]
    batch = build_packed_batch(seqs, [[1] * len(s) for s in seqs], zeros, zeros)
    for temperature in (1.0, 0.7):
        with torch.no_grad():
            got = PackedCausalLM(model)(batch, temperature=temperature)
        start = 0
        for s in seqs:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([s])).logits[0].float() / temperature
            ref = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(s[1:])[:, None])[:, 0]
            assert torch.allclose(got[start:start + len(s) - 1], ref, atol=1e-4), (len(s), temperature)
            start += len(s)
