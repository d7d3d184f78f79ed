"""DeepSpeed's client optimizer (``deepspeed.initialize(optimizer=torch_optimizer,
lr_scheduler=...)``, what Accelerate passes): the engine steps as that torch optimizer would,
follows the lr a torch scheduler gives it, saves and restores that lr, and refuses what its one
hyperparameter set cannot run, naming the fix. One process (world 1): the multi-rank run is
tests/distributed/test_accelerate_scripts.py."""

from __future__ import annotations

import pytest
import shardwise.deepspeed
import torch
from shardwise.fsdp import ConfigError
from shardwise.zero import client_optimizer

CONFIG = {"train_batch_size": 4, "gradient_accumulation_steps": 1}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 6, generator=generator), torch.randn(4, 3, generator=generator))
            for _ in range(count)]  # fmt: skip


def _train_torch(model, optimizer, scheduler, batches) -> list[float]:
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    return losses


def _train_engine(engine, scheduler, batches) -> list[float]:
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        if scheduler is not None:  # stepped by the caller, as Accelerate's scheduler wrapper
            scheduler.step()
        losses.append(loss.item())
    return losses


OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2, eps=1e-6),
    "sgd": lambda p: torch.optim.SGD(p, lr=5e-2, momentum=0.9, nesterov=True, weight_decay=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_engine_steps_as_the_client_optimizer_under_its_scheduler(name):
    """Catches a client optimizer whose hyperparameters are dropped (lr, betas, eps, weight
    decay, momentum, nesterov) or whose lr the engine does not follow when a torch scheduler
    moves it: the engine's losses and weights equal torch's own optimizer's within fp32 noise."""
    reference = _model()
    optimizer = OPTIMIZERS[name](reference.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    expected = _train_torch(reference, optimizer, scheduler, _batches(8))

    model = _model()
    client = OPTIMIZERS[name](model.parameters())
    client_scheduler = torch.optim.lr_scheduler.LambdaLR(client, lambda step: 1.0 / (1 + step))
    engine, _, _, _ = shardwise.deepspeed.initialize(model=model, optimizer=client, config=CONFIG)
    got = _train_engine(engine, client_scheduler, _batches(8))
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-7)
    for a, b in zip(engine.module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert engine.get_lr() == [client.param_groups[0]["lr"]]


def test_a_scheduler_passed_to_initialize_is_stepped_by_the_engine():
    """Catches DeepSpeed's lr_scheduler= (a scheduler on the client optimizer) accepted and never
    stepped: after three steps the lr is the scheduler's third."""
    model = _model()
    client = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(client, step_size=1, gamma=0.5)
    engine, _, _, returned = shardwise.deepspeed.initialize(
        model=model, optimizer=client, lr_scheduler=scheduler, config=CONFIG
    )
    assert returned is scheduler
    _train_engine(engine, None, _batches(3))
    assert engine.get_lr() == [pytest.approx(1e-2 * 0.5**3)]


def test_the_lr_in_effect_is_saved_and_restored(tmp_path):
    """Catches a checkpoint that restores the lr of the last step instead of the one the
    scheduler set after it (DeepSpeed's optimizer state carries its groups' lr)."""
    model = _model()
    client = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(client, lambda step: 1.0 / (1 + step))
    engine, _, _, _ = shardwise.deepspeed.initialize(model=model, optimizer=client, config=CONFIG)
    _train_engine(engine, scheduler, _batches(2))
    engine.save_checkpoint(tmp_path, tag="t")
    saved_lr = client.param_groups[0]["lr"]
    engine.set_lr(1.0)
    engine.load_checkpoint(tmp_path, tag="t")
    assert client.param_groups[0]["lr"] == pytest.approx(saved_lr) == pytest.approx(1e-2 / 3)


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda m: torch.optim.AdamW(
                [{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": 1.0}]
            ),
            "parameter groups differ in lr",
        ),  # fmt: skip
        (lambda m: torch.optim.AdamW(m.parameters(), amsgrad=True), "amsgrad=True"),
        (lambda m: torch.optim.Adam(m.parameters(), weight_decay=0.1), "adam_w_mode"),
        (lambda m: torch.optim.RMSprop(m.parameters()), "RMSprop optimizer is not supported"),
        (lambda m: torch.optim.AdamW(m[0].parameters()), "the model's trainable parameters"),
    ],
)
def test_what_one_hyperparameter_set_cannot_run_is_refused_with_the_fix(build, message):
    """Catches a client optimizer silently trained with other hyperparameters or on another
    parameter set."""
    model = _model()
    with pytest.raises(ConfigError, match=message):
        shardwise.deepspeed.initialize(model=model, optimizer=build(model), config=CONFIG)


def test_a_scheduler_without_its_optimizer_is_refused():
    """Catches an lr_scheduler object that nothing would step (no client optimizer whose lr the
    engine follows), and one given beside the config's scheduler section."""
    model = _model()
    scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(model.parameters()), 1)
    with pytest.raises(ConfigError, match="needs the torch optimizer it steps"):
        shardwise.deepspeed.initialize(model=model, lr_scheduler=scheduler, config=CONFIG)
    config = {**CONFIG, "scheduler": {"type": "WarmupLR", "params": {}}}
    client = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="scheduler section were both given"):
        shardwise.deepspeed.initialize(model=model, optimizer=client, lr_scheduler=scheduler,
                                       config=config)  # fmt: skip


def test_the_section_names_the_hyperparameters():
    """Catches a mapping that loses a hyperparameter (betas, eps, decoupled decay)."""
    model = _model()
    adam = torch.optim.Adam(model.parameters(), lr=0.2, betas=(0.7, 0.9), eps=1e-4,
                            decoupled_weight_decay=True, weight_decay=0.3)  # fmt: skip
    assert client_optimizer.config_section(adam) == {
        "type": "Adam",
        "params": {
            "lr": 0.2,
            "betas": (0.7, 0.9),
            "eps": 1e-4,
            "weight_decay": 0.3,
            "adam_w_mode": True,
        },  # fmt: skip
    }
