"""Your own model and datasets in memory, trained by shardwise from Python (docs/python_api.md)::

    torchrun --nproc_per_node=2 examples/train_from_python.py --strategy fsdp --steps 40

The model is a small causal transformer written here; the data is English prose from Python's
own help topics, as bytes, cut into sequences of 129 tokens. Outputs (metrics, checkpoints,
TensorBoard, the trained weights) go to outputs/from_python; ``shardwise-plot`` draws them.
"""

from __future__ import annotations

import argparse
from pydoc_data.topics import topics

import shardwise
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.layer(x, src_mask=mask, is_causal=True)


class CausalTransformer(nn.Module):
    """Token ids [batch, seq] to logits [batch, seq, vocab]; its blocks are an nn.ModuleList of
    one class, so FSDP and ZeRO-3 shard them as units."""

    def __init__(self, vocab: int = 256, dim: int = 128, layers: int = 4, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(1, 512, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def sequences(length: int = 129) -> torch.Tensor:
    """The help topics' UTF-8 bytes as rows of ``length`` token ids."""
    text = "\n\n".join(topics[key] for key in sorted(topics)).encode()
    tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    return tokens[: len(tokens) // length * length].view(-1, length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="fsdp", choices=["ddp", "fsdp", "zero"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default="outputs/from_python")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = sequences()
    train, evaluation = list(rows[:-64]), list(rows[-64:])  # map-style: lists of token tensors
    zero = {"zero": {"zero_optimization": {"stage": 3}}} if args.strategy == "zero" else {}
    trainer = shardwise.Trainer(
        CausalTransformer(),
        train,
        evaluation,
        training_config={
            "micro_batch_size": 4,
            "max_steps": args.steps,
            "learning_rate": 1e-3,
            "warmup_steps": args.steps // 4,
            "mixed_precision": "bf16",
            "eval_every": 20,
            "checkpoint": {"dir": args.out, "every_steps": 20},
        },
        distributed_config=shardwise.DistributedConfig(strategy=args.strategy, **zero),
    )
    result = trainer.train()
    if torch.distributed.get_rank() == 0:
        print(f"loss {result['loss']:.3f}, eval loss {result['val_loss']:.3f}")


if __name__ == "__main__":
    main()
