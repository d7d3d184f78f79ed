"""A DeepSpeed training script as the DeepSpeed tutorials write it (argparse with
add_config_arguments, init_distributed, initialize with training_data, backward/step, a
checkpoint with client state, then a resume). The tests run it with DeepSpeed and, with the one
import line changed, with shardwise; rank 0 writes what it saw to <out>/result.json."""

import argparse
import json
import os

import deepspeed
import torch
import torch.nn.functional as F
from torch import nn


def model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4)
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=g)
    y = (x[:, :4].argmax(1) + (x[:, 4] > 0).long()) % 4
    return model, torch.utils.data.TensorDataset(x, y)


def train(engine, loader, steps):
    losses = []
    for x, y in loader:
        loss = F.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if len(losses) == steps:
            break
    return losses


def main():
    parser = argparse.ArgumentParser(description="DeepSpeed textbook script")
    parser.add_argument("--local_rank", type=int, default=-1, help="passed by the launcher")
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    launched_with = args.local_rank  # deepspeed's launcher passes --local_rank; torchrun does not
    deepspeed.init_distributed()

    model, data = model_and_data()
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data=data
    )
    first = train(engine, loader, 16)
    engine.save_checkpoint(args.out, client_state={"seen": len(first)})
    after = train(engine, loader, 8)  # the rest of the epoch's batches: 16 + 8 = 24

    model, data = model_and_data()
    resumed, _, resumed_loader, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data=data
    )
    path, client = resumed.load_checkpoint(args.out)
    it = iter(resumed_loader)
    for _ in range(client["seen"]):
        next(it)
    again = train(resumed, it, 8)
    if resumed.global_rank == 0:
        facts = {
            "losses": first + after,
            "resumed": again,
            "latest": open(os.path.join(args.out, "latest")).read().strip(),
            "loaded": os.path.basename(os.path.dirname(path)),  # the tag folder
            "client": client,
            "launched_with": launched_with,
            "local_rank": args.local_rank,
            "engine_local_rank": engine.local_rank,
            "world_size": engine.world_size,
            "train_batch_size": engine.train_batch_size(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
            "global_steps": engine.global_steps,
            "lr": scheduler.get_last_lr()[0] if scheduler is not None else None,
        }
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump(facts, f)


if __name__ == "__main__":
    main()
