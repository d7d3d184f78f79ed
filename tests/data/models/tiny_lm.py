"""A model factory as a user writes one for ``model.factory: tests/data/models/tiny_lm.py:tiny_lm``:
a plain torch module (not the bundled GPT, no Hugging Face) that maps token ids to logits."""

import torch
from torch import nn


class Mixer(nn.Module):
    """A causal block: each position mixes with a running mean of the ones before it."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mix = nn.Linear(2 * dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        h = self.norm(x)
        steps = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[None, :, None]
        past = h.cumsum(1) / steps
        return x + self.out(torch.nn.functional.gelu(self.mix(torch.cat([h, past], -1))))


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(Mixer(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def tiny_lm(vocab_size: int = 256, dim: int = 32, layers: int = 2) -> nn.Module:
    return TinyLM(vocab_size, dim, layers)
