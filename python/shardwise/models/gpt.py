"""A GPT family sized by config (tiny to about 1B parameters): token and position embeddings,
pre-norm transformer blocks in ``blocks`` (an ``nn.ModuleList``, so FSDP's transformer
auto-wrap finds them), a final norm and a head tied to the token embedding."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 8192
    seq_len: int = 256
    dim: int = 512
    layers: int = 6
    heads: int = 8
    mlp_ratio: int = 4
    dropout: float = 0.0

    def num_parameters(self) -> int:
        per_block = 4 * self.dim * self.dim + 2 * self.mlp_ratio * self.dim * self.dim
        per_block += 4 * self.dim + (self.mlp_ratio + 1) * self.dim + 4 * self.dim  # biases, norms
        return (
            self.vocab_size * self.dim
            + self.seq_len * self.dim
            + self.layers * per_block
            + 2 * self.dim
        )


PRESETS = {
    "tiny": GPTConfig(vocab_size=256, seq_len=64, dim=64, layers=2, heads=4),
    "small": GPTConfig(vocab_size=8192, seq_len=256, dim=512, layers=6, heads=8),  # ~23M
    "medium": GPTConfig(vocab_size=32768, seq_len=1024, dim=1024, layers=16, heads=16),
    "1b": GPTConfig(vocab_size=32768, seq_len=2048, dim=2048, layers=18, heads=16),
}


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.dim // cfg.heads
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.up = nn.Linear(cfg.dim, cfg.mlp_ratio * cfg.dim)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.dim, cfg.dim)
        self.dropout = cfg.dropout

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """The attention half with its residual (pipeline splitting may cut between halves).
        The head count and sequence length come from the QKV output, so the block also runs
        with its heads split across tensor-parallel ranks and its tokens sequence-parallel."""
        qkv = self.qkv(self.norm1(x))
        b, t = qkv.shape[:2]
        q, k, v = qkv.view(b, t, 3, -1, self.head_dim).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return x + self.proj(attn.transpose(1, 2).reshape(b, t, -1))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP half with its residual."""
        return x + self.down(F.gelu(self.up(self.norm2(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attention(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos = nn.Embedding(cfg.seq_len, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean token loss; tensor parallelism's ``LossParallel`` replaces it on the instance
        by the vocabulary-parallel loss of logits split on the vocabulary."""
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.cross_entropy(self(tokens), targets)
