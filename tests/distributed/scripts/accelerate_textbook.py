"""A text classifier trained as Accelerate's examples train one (nlp_example.py with gradient
accumulation): a BERT classifier, AdamW with a linear warm-up schedule, ``accumulate``,
``backward``, ``clip_grad_norm_`` on the sync steps, ``gather`` for the losses and
``gather_for_metrics`` for the accuracy, ``save_state`` after the first epoch, ``load_state``
to train the second epoch again, and ``save_model`` at the end. The data is synthetic (the label
says which half of the sequence has the larger token sum), nothing is downloaded.

    ACCELERATE_USE_CPU=true torchrun --nproc_per_node=2 accelerate_textbook.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup


def examples(count: int, seed: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (count, 16), generator=generator)
    labels = (ids[:, 0] >= 52).long()
    return [{"input_ids": i, "labels": y} for i, y in zip(ids, labels, strict=True)]


def train_epoch(accelerator, model, optimizer, scheduler, loader) -> list[float]:
    model.train()
    losses = []
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        losses.append(accelerator.gather(loss.detach()[None]).float().mean().item())
    return losses


def accuracy(accelerator, model, loader) -> float:
    model.eval()
    right = total = 0
    for batch in loader:
        with torch.no_grad():
            predictions = model(**batch).logits.argmax(-1)
        predictions, labels = accelerator.gather_for_metrics((predictions, batch["labels"]))
        right += int((predictions == labels).sum())
        total += labels.numel()
    return right / total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--mixed_precision", default="bf16")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    args = parser.parse_args()
    accelerator = Accelerator(
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
    )
    set_seed(42)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)  # fmt: skip
    model = BertForSequenceClassification(config)
    train_loader = DataLoader(examples(128, 1), shuffle=True, batch_size=4)
    eval_loader = DataLoader(examples(40, 2), batch_size=8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    steps = 2 * len(train_loader) // accelerator.num_processes // args.gradient_accumulation_steps
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, steps)
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler
    )
    out = Path(args.out)
    losses = train_epoch(accelerator, model, optimizer, scheduler, train_loader)
    accelerator.save_state(str(out / "state"))
    losses += train_epoch(accelerator, model, optimizer, scheduler, train_loader)
    first_accuracy = accuracy(accelerator, model, eval_loader)
    accelerator.load_state(str(out / "state"))
    resumed = train_epoch(accelerator, model, optimizer, scheduler, train_loader)
    accelerator.save_model(model, str(out / "model"))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        result = {
            "losses": losses,
            "resumed": resumed,
            "accuracy": first_accuracy,
            "resumed_accuracy": accuracy(accelerator, model, eval_loader),
            "num_processes": accelerator.num_processes,
            "distributed_type": str(accelerator.distributed_type),
            "backend": torch.distributed.get_backend()
            if torch.distributed.is_initialized()
            else None,
            "state_files": sorted(p.name for p in (out / "state").iterdir()),
            "model_files": sorted(p.name for p in (out / "model").iterdir()),
            "lr": scheduler.get_last_lr()[0],
            "model_class": type(model).__name__,  # what prepare wrapped the model in
            "local_numel": sum(p.numel() for p in model.parameters()),  # this rank's share
        }
        (out / "result.json").write_text(json.dumps(result))
    else:
        accuracy(accelerator, model, eval_loader)  # gather_for_metrics is collective
    accelerator.end_training()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
