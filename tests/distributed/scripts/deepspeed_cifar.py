"""An image classifier trained as DeepSpeed's CIFAR-10 example trains one: the DeepSpeed config
built in the script from ``--stage`` and ``--dtype`` (Adam with a WarmupLR schedule, clipping),
``initialize(args=, model=, model_parameters=, training_data=, config=)``, the device named by
``get_accelerator().device_name(model_engine.local_rank)``, the inputs cast to the engine's
16-bit type, two epochs over DeepSpeed's loader, then the test accuracy. The images are
CIFAR-10-shaped (3 x 32 x 32, normalized to [-1, 1], ten classes) and synthetic: nothing is
downloaded. The tests run it with DeepSpeed and, with the two ``deepspeed`` imports changed,
with shardwise; rank 0 writes what it saw to <out>/result.json.

    torchrun --nproc_per_node=2 deepspeed_cifar.py --deepspeed --stage 2 --dtype bf16 --out D
"""

import argparse
import json
import os

import deepspeed
import torch
import torch.nn.functional as F
from deepspeed.accelerator import get_accelerator
from torch import nn


def add_argument():
    parser = argparse.ArgumentParser(description="CIFAR")
    parser.add_argument("-e", "--epochs", default=2, type=int, help="epochs")
    parser.add_argument("--local_rank", type=int, default=-1, help="from the launcher")
    parser.add_argument("--log-interval", type=int, default=8, help="steps between prints")
    parser.add_argument("--dtype", default="fp32", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--stage", default=0, type=int, choices=[0, 1, 2, 3])
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def cifar_like(count: int, seed: int) -> torch.utils.data.TensorDataset:
    """Ten classes of 32 x 32 colour images: class c brightens one channel in one band."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (count,), generator=generator)
    images = torch.rand(count, 3, 32, 32, generator=generator) * 0.85
    for i, c in enumerate(labels.tolist()):
        images[i, c % 3, (c // 3) * 8 : (c // 3) * 8 + 8, :] += 0.15
    return torch.utils.data.TensorDataset((images - 0.5) / 0.5, labels)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def get_ds_config(args):
    return {
        "train_batch_size": 16,
        "steps_per_print": 2000,
        "optimizer": {
            "type": "Adam",
            "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 20},
        },
        "gradient_clipping": 1.0,
        "prescale_gradients": False,
        "bf16": {"enabled": args.dtype == "bf16"},
        "fp16": {"enabled": args.dtype == "fp16", "initial_scale_power": 15},
        "wall_clock_breakdown": False,
        "zero_optimization": {
            "stage": args.stage,
            "allgather_partitions": True,
            "reduce_scatter": True,
            "allgather_bucket_size": 50000000,
            "reduce_bucket_size": 50000000,
            "overlap_comm": True,
            "contiguous_gradients": True,
        },
    }


def main():
    args = add_argument()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    trainset, testset = cifar_like(512, 1), cifar_like(128, 2)
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    model_engine, optimizer, trainloader, _ = deepspeed.initialize(
        args=args,
        model=net,
        model_parameters=parameters,
        training_data=trainset,
        config=get_ds_config(args),
    )
    local_device = get_accelerator().device_name(model_engine.local_rank)
    local_rank = model_engine.local_rank
    target_dtype = None
    if model_engine.bfloat16_enabled():
        target_dtype = torch.bfloat16
    elif model_engine.fp16_enabled():
        target_dtype = torch.half

    criterion = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(args.epochs):
        running_loss = 0.0
        for i, data in enumerate(trainloader):
            inputs, labels = data[0].to(local_device), data[1].to(local_device)
            if target_dtype is not None:
                inputs = inputs.to(target_dtype)
            outputs = model_engine(inputs)
            loss = criterion(outputs, labels)
            model_engine.backward(loss)
            model_engine.step()
            losses.append(loss.item())
            running_loss += loss.item()
            if local_rank == 0 and i % args.log_interval == args.log_interval - 1:
                print(f"[{epoch + 1} : {i + 1:5d}] loss: {running_loss / args.log_interval:.3f}")
                running_loss = 0.0

    correct = total = 0
    model_engine.eval()
    with torch.no_grad():
        for images, labels in torch.utils.data.DataLoader(testset, batch_size=4):
            if target_dtype is not None:
                images = images.to(target_dtype)
            outputs = model_engine(images.to(local_device))
            predicted = outputs.argmax(1)
            total += labels.size(0)
            correct += (predicted == labels.to(local_device)).sum().item()
    if torch.distributed.get_rank() == 0:
        result = {
            "losses": losses,
            "accuracy": correct / total,
            "device": local_device,
            "global_steps": model_engine.global_steps,
            "lr": model_engine.get_lr(),
            "bf16": model_engine.bfloat16_enabled(),
        }
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
