"""Training from Python as a user writes it: a model built in the script, datasets in memory,
``shardwise.Trainer(model, train_dataset, eval_dataset, config=...).train()``. Each rank seeds
its own model differently (the Trainer starts every rank from rank 0's weights, as DDP does).

    torchrun --nproc_per_node=2 trainer_api.py --form tensors --strategy fsdp --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import shardwise
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "data" / "models"))
from tiny_lm import TinyLM  # noqa: E402

VOCAB, SEQ, GLOBAL_BATCH = 64, 16, 8
STRATEGIES = {
    "ddp": {"strategy": "ddp"},
    "fsdp": {"strategy": "fsdp"},
    "zero3": {"strategy": "zero", "zero": {"zero_optimization": {"stage": 3}}},
    # the model's own layers cut over the ranks (one process: DDP over one rank)
    "tp": {"strategy": "ddp", "tensor_parallel_size": 2},
    "pipeline": {"strategy": "pipeline", "pipeline_parallel_size": 2,
                 "pipeline": {"num_microbatches": 2}},
}  # fmt: skip


def distributed(strategy: str, world: int) -> tuple[dict, int]:
    """(the distributed section, the micro-batch) for ``strategy`` at ``world``: the global
    batch is GLOBAL_BATCH sequences whatever the layout (tp and the pipeline on one process:
    DDP over one rank)."""
    if strategy in ("tp", "pipeline") and world == 1:
        return STRATEGIES["ddp"], GLOBAL_BATCH
    if strategy == "tp":
        return STRATEGIES[strategy], GLOBAL_BATCH
    if strategy == "pipeline":  # a micro-batch is one of the pipeline's 2 microbatches
        return STRATEGIES[strategy], GLOBAL_BATCH // 2
    return STRATEGIES[strategy], GLOBAL_BATCH // world


class Stream(torch.utils.data.IterableDataset):
    """An iterable dataset: the sequences in its own order, no length."""

    def __init__(self, rows):
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)


def items(form: str, tokens: torch.Tensor):
    rows = list(tokens)
    if form == "tensors":
        return rows
    if form == "pairs":
        return [(row[:-1], row[1:]) for row in rows]
    if form == "iterable":
        return Stream(rows)
    if form in ("dicts", "hf"):
        from datasets import Dataset

        return Dataset.from_dict({"input_ids": tokens.tolist()})
    raise SystemExit(f"unknown form {form}")


def counting(rows: int, generator: torch.Generator) -> torch.Tensor:
    """Sequences that count from a random start in steps of 1, 2 or 3 (mod the vocabulary):
    learnable within a few steps."""
    start = torch.randint(0, VOCAB, (rows, 1), generator=generator)
    step = torch.randint(1, 4, (rows, 1), generator=generator)
    return (start + step * torch.arange(SEQ + 1)) % VOCAB


def model_for(form: str) -> torch.nn.Module:
    if form != "hf":
        return TinyLM(VOCAB, 32, 2)
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=32, vocab_size=VOCAB,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    return GPT2LMHeadModel(config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--form", default="tensors")
    parser.add_argument("--strategy", default="ddp", choices=sorted(STRATEGIES))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(int(os.environ.get("RANK", "0")))  # ranks differ until the Trainer
    model = model_for(args.form)
    data = torch.Generator().manual_seed(7)
    train = items(args.form, counting(96, data))
    val = items(args.form, counting(16, data))
    section, micro = distributed(args.strategy, world)
    config = {
        "training": {
            "micro_batch_size": micro, "max_steps": args.steps,
            "mixed_precision": "no", "learning_rate": 1e-2, "warmup_steps": 2,
            "eval_every": 3, "eval_batches": 2, "checkpoint": {"dir": args.out, "every_steps": 3},
        },
        "distributed": {"backend": "shardwise", **section},
    }  # fmt: skip
    result = shardwise.Trainer(model, train, val, config=config).train()
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.out, "result.json").write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
