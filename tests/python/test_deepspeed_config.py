"""DeepSpeed configs as people write them (issue 17): the real-world files in
tests/data/deepspeed/ load, warn about exactly what is ignored, or are refused for the reason
named; "auto" values; the schedulers against DeepSpeed's own classes; training under a scheduler
against torch's AdamW driven by DeepSpeed's scheduler; and ``shardwise.deepspeed.initialize``'s
4-tuple. Single process: the multi-rank parity of prescale_gradients and
gradient_predivide_factor is in tests/distributed/zero_checks.py."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import shardwise.deepspeed
import shardwise.zero
import torch
from deepspeed.runtime import lr_schedules
from shardwise import _C
from shardwise.fsdp import ConfigError
from shardwise.zero.config import DeepSpeedConfigWarning, load

DATA = Path(__file__).resolve().parents[1] / "data" / "deepspeed"
TRAINER = {  # what a trainer fills "auto" from
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 3,
    "train_batch_size": 12,
    "gradient_clipping": 1.0,
    "fp16": False,
    "bf16": True,
    "lr": 2e-4,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "weight_decay": 0.1,
    "warmup_min_lr": 0.0,
    "warmup_num_steps": 10,
    "total_num_steps": 100,
}


def loaded(name: str, world: int = 1, auto=None):
    """(the loaded config, the ignored keys' warning text or "")."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load(DATA / name, world, auto)
    texts = [str(w.message) for w in caught if issubclass(w.category, DeepSpeedConfigWarning)]
    assert len(texts) <= 1, texts  # one warning per config
    return config, texts[0] if texts else ""


def test_every_shipped_config_is_covered_below():
    """Catches: a config added to tests/data without a test of what it should do."""
    shipped = {p.name for p in DATA.glob("*.json")}
    assert shipped == set(EXPECTED) | set(REFUSED), shipped ^ (set(EXPECTED) | set(REFUSED))


# name: (world, auto, the ignored keys the warning names, checks on the result)
EXPECTED = {
    "hf_transformers_ds_config_zero2.json": (
        2,
        TRAINER,
        [
            "steps_per_print",
            "wall_clock_breakdown",
        ],
        lambda c: (
            c["native"]["offload_optimizer"]
            and c["native"]["pin_memory"]
            and c["bf16"]["enabled"]
            and c["native"]["optimizer"]["lr"] == 2e-4
            and c["schedule"]["warmup_max_lr"] == 2e-4
            and c["schedule"]["warmup_num_steps"] == 10
            and c["train_batch_size"] == 12
            and c["native"]["gradient_predivide_factor"] == 1.0
        ),
    ),
    "hf_transformers_ds_config_zero3.json": (
        1,
        TRAINER,
        [
            "sub_group_size",
            "stage3_param_persistence_threshold",
            "stage3_max_live_parameters",
            "stage3_max_reuse_distance",
            "stage3_gather_fp16_weights_on_model_save",
            "steps_per_print",
            "wall_clock_breakdown",
        ],
        lambda c: (
            c["native"]["offload_param"]
            and c["native"]["pin_memory"]
            and c["native"]["stage"] == 3
            and c["native"]["reduce_bucket_numel"] == 1  # DeepSpeed's 0: no bucketing
            and c["native"]["loss_scaler"]["dynamic"]
            and c["train_micro_batch_size_per_gpu"] == 2
        ),  # from the trainer: the file has none
    ),
    "deepspeedexamples_cifar_ds_config.json": (
        1,
        None,
        ["fp16.fp16_master_weights_and_grads", "steps_per_print", "wall_clock_breakdown"],
        lambda c: (
            c["native"]["offload_optimizer"]  # the deprecated cpu_offload: true
            and c["native"]["optimizer"]["type"] == "adamw"
            and c["native"]["loss_scaler"]["initial_scale"] == 2.0**15
            and c["train_micro_batch_size_per_gpu"] == 4
        ),
    ),
    "deepspeedexamples_megatron_ds_zero2_config.json": (
        2,
        None,
        ["activation_checkpointing", "steps_per_print", "wall_clock_breakdown"],
        lambda c: c["train_micro_batch_size_per_gpu"] == 8 and c["schedule"] is None,
    ),
    "deepspeedexamples_autotuning_ds_config_z3.json": (
        1,
        {"train_micro_batch_size_per_gpu": 3},
        [],
        lambda c: c["train_micro_batch_size_per_gpu"] == 3 and c["native"]["stage"] == 3,
    ),
}
REFUSED = {
    "deepspeedexamples_megatron_ds_zero-offload_config.json": "optimizer.type 'DeepSpeed_Adam'",
    "deepspeedexamples_megatron_zero3_ds_zero_stage_3_config.json": "unknown key "
    "'stage3_param_persitence_threshold'. Did you mean 'stage3_param_persistence_threshold'?",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_configs_load_and_name_what_they_ignore(name):
    """Catches: a documented DeepSpeed key refused (issue 17: steps_per_print, cpu_offload,
    offload_param, ... failed on the first), an ignored key not reported, or one reported that
    is in fact implemented."""
    world, auto, ignored, check = EXPECTED[name]
    config, warning = loaded(name, world, auto)
    named = sorted(entry.split(" (")[0] for entry in config["ignored"])
    top = ("steps_per_print", "wall_clock_breakdown", "activation_checkpointing")
    expected = sorted(k if "." in k or k in top else f"zero_optimization.{k}" for k in ignored)
    assert named == expected, warning
    assert all(entry in warning for entry in config["ignored"]), warning
    assert check(config), config


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_real_configs_with_errors_are_refused_naming_them(name):
    """Catches: a misspelt key (here one DeepSpeedExamples ships) silently ignored, or an
    optimizer shardwise does not have silently replaced."""
    with pytest.raises(ConfigError) as error:
        load(DATA / name, 1)
    assert REFUSED[name] in str(error.value)


@pytest.mark.parametrize(
    "zero, named",
    [
        ({"contiguous_gradients": False}, "contiguous_gradients=false"),
    ],
)
def test_choices_shardwise_does_not_have_are_named_with_what_runs(zero, named):
    """Catches: contiguous_gradients=false parsed and ignored without a word (allgather_bucket_size
    and pin_memory now take effect: zero_checks). DeepSpeed's defaults (what runs) are not
    named."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load({"train_batch_size": 2, "zero_optimization": {"stage": 2, **zero}}, 1)
        quiet = load(
            {
                "train_batch_size": 2,
                "zero_optimization": {"stage": 2, "contiguous_gradients": True},
            },
            1,
        )
    assert any(named in entry and "(" in entry for entry in config["ignored"]), config["ignored"]
    assert quiet["ignored"] == []
    assert any(named in str(w.message) for w in caught)


def test_auto_without_a_value_names_the_key():
    """Catches: "auto" passed through as a string (DeepSpeed would fail later, far from it)."""
    with pytest.raises(ConfigError, match=r'fp16.enabled: "auto" is filled from the trainer'):
        load(DATA / "hf_transformers_ds_config_zero2.json", 1)


def test_bucket_sizes_auto_follow_the_models_hidden_size():
    """Catches: Hugging Face's rule for "auto" bucket sizes (hidden²) not applied."""

    class Model(torch.nn.Linear):
        def __init__(self):
            super().__init__(8, 8)
            self.config = type("Config", (), {"hidden_size": 64})()

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
    }
    engine = shardwise.zero.initialize(Model(), config)
    assert engine.config["native"]["reduce_bucket_numel"] == 64 * 64


@pytest.mark.parametrize(
    "config, words",
    [
        (
            {
                "scheduler": {
                    "type": "WarmupCosineLR",
                    "params": {"warmup_min_lr": 0, "total_num_steps": 9},
                }
            },
            "scheduler.params.warmup_min_lr: WarmupCosineLR does not take it",
        ),
        ({"scheduler": {"type": "WarmupDecayLR", "params": {}}}, "total_num_steps is required"),
        ({"scheduler": {"type": "OneCycle"}}, "scheduler.type 'OneCycle'"),
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}},
            "scheduler.params.warmup_type 'cosine'",
        ),
        (
            {"optimizer": {"type": "Adam", "params": {"adam_w_mode": False, "weight_decay": 0.1}}},
            "optimizer.params.adam_w_mode=False is not supported",
        ),
        ({"optimizer": {"type": "AdamW", "params": {"amsgrad": True}}}, "amsgrad=True"),
        (
            {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
            "offload_param needs stage 3",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
            "offload_param.device 'nvme'",
        ),
        ({"gradient_predivide_factor": 0}, "gradient_predivide_factor must be > 0"),
        (
            {"optimizer": {"type": "Adam", "params": {"bias_correction": False}}},
            "optimizer.params.bias_correction=False is not supported",
        ),
    ],
)
def test_values_that_would_change_training_are_refused(config, words):
    """Catches: NVMe, coupled weight decay, AMSGrad, a scheduler given another's keys, quietly
    trained as something else."""
    with pytest.raises(ConfigError) as error:
        load({"train_micro_batch_size_per_gpu": 1, **config}, 1)
    assert words in str(error.value)


def deepspeed_lrs(kind: str, params: dict, base_lr: float, steps: int) -> list[float]:
    """The lr DeepSpeed's own scheduler gives a torch optimizer: before the first step (set at
    construction) and after each scheduler step."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base_lr)
    scheduler = getattr(lr_schedules, kind)(opt, **params)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(steps):
        scheduler.step()
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


SCHEDULES = [
    ("WarmupLR", {"warmup_min_lr": 1e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 17}),
    (
        "WarmupDecayLR",
        {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-4, "warmup_num_steps": 7, "total_num_steps": 40},
    ),
    (
        "WarmupCosineLR",
        {
            "warmup_min_ratio": 0.05,
            "warmup_num_steps": 9,
            "total_num_steps": 45,
            "cos_min_ratio": 0.02,
        },
    ),
    ("WarmupCosineLR", {"warmup_num_steps": 1, "total_num_steps": 10}),
    ("WarmupCosineLR", {"warmup_num_steps": 12, "total_num_steps": 8}),  # no decay window
]


@pytest.mark.parametrize("warmup_type", ["log", "linear"])
@pytest.mark.parametrize("kind, params", SCHEDULES)
def test_schedules_equal_deepspeeds_own(kind, params, warmup_type):
    """Catches: any difference from deepspeed.runtime.lr_schedules, iteration by iteration,
    including the first step's lr (iteration -1) and the cosine's one-step shift."""
    params = {**params, "warmup_type": warmup_type}
    theirs = deepspeed_lrs(kind, params, 3e-4, 60)
    schedule = _C.WarmupSchedule({"type": kind, "base_lr": 3e-4, **params})
    ours = [schedule.lr(i) for i in range(-1, 60)]
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-18), (i - 1, a, b)


def test_a_scheduled_engine_trains_like_torch_adamw_under_deepspeeds_scheduler():
    """Catches: the scheduler stepped at the wrong time (DeepSpeed: after each optimizer step,
    the first step at iteration -1's lr), or its lr not reaching the fused optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    reference.load_state_dict(model.state_dict())
    sched = {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2, "warmup_num_steps": 4,
             "total_num_steps": 12, "warmup_type": "linear"}  # fmt: skip
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupDecayLR", "params": sched},
        "zero_optimization": {"stage": 1},
    }
    engine = shardwise.zero.initialize(model, config)
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = lr_schedules.WarmupDecayLR(opt, **sched)
    for step in range(12):
        x, y = torch.randn(4, 6), torch.randn(4, 3)
        assert math.isclose(engine.get_lr()[0], opt.param_groups[0]["lr"], rel_tol=1e-12), step
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        opt.step()
        opt.zero_grad()
        scheduler.step()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6), (ours - theirs).abs().max()


def test_deepspeed_initialize_returns_its_four_tuple():
    """Catches: a drop-in that does not return DeepSpeed's (engine, optimizer, loader,
    scheduler), a loader with the wrong micro batch, or objects DeepSpeed would use silently
    ignored."""
    model = torch.nn.Linear(4, 2)
    data = torch.utils.data.TensorDataset(torch.randn(10, 4), torch.randn(10, 2))
    config = {
        "train_batch_size": 5,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
    }
    engine, optimizer, loader, scheduler = shardwise.deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=data, config=config
    )
    assert optimizer is engine.optimizer and scheduler is engine.lr_scheduler
    assert [len(x) for x, _ in loader] == [5, 5]
    assert engine.get_lr() == [0.0]  # WarmupLR before its first step: warmup_min_lr
    with pytest.raises(ConfigError, match="config's optimizer section were both given"):
        shardwise.deepspeed.initialize(model=model, optimizer=object(), config=config)
    with pytest.raises(ConfigError, match="model_parameters must be the model's trainable"):
        shardwise.deepspeed.initialize(model=model, model_parameters=[model.weight], config=config)


def test_adams_kernel_choices_are_named_with_what_runs():
    """Catches optimizer.params.torch_adam / fused / foreach (DeepSpeed's pick of an Adam
    kernel) dropped without a word: each is named in the warning with what runs instead."""
    params = {"lr": 1e-3, "torch_adam": True, "fused": True, "foreach": False}
    config = load({"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": params}}, 1)
    for key in ("torch_adam", "fused", "foreach"):
        assert any(f"optimizer.params.{key} (" in entry for entry in config["ignored"]), key


@pytest.mark.parametrize(
    "kind, params",
    [
        ("AdamW", {"betas": [0.8, 0.99]}),
        ("AdamW", {"eps": 1e-2}),
        ("SGD", {"momentum": 0.9, "dampening": 0.5}),
    ],
)
def test_optimizer_params_reach_the_fused_optimizer(kind, params):
    """Catches optimizer.params betas, eps or dampening parsed and dropped: the engine trains
    as torch's optimizer given the same values, and not as it would with the defaults (so the
    value is what made the difference)."""
    torch.manual_seed(0)
    batches = [(torch.randn(4, 6), torch.randn(4, 3)) for _ in range(6)]

    def trained(given, engine_run):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        if engine_run:
            config = {
                "train_micro_batch_size_per_gpu": 4,
                "optimizer": {"type": kind, "params": {"lr": 1e-2, **given}},
                "zero_optimization": {"stage": 1},
            }
            engine = shardwise.zero.initialize(model, config)
            for x, y in batches:
                engine.backward(torch.nn.functional.mse_loss(engine(x), y))
                engine.step()
            return torch.cat([p.detach().view(-1) for p in model.parameters()])
        args = {k: tuple(v) if k == "betas" else v for k, v in given.items()}
        opt = (torch.optim.AdamW if kind == "AdamW" else torch.optim.SGD)(
            model.parameters(), lr=1e-2, **({"weight_decay": 0.0} | args)
        )
        for x, y in batches:
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        return torch.cat([p.detach().view(-1) for p in model.parameters()])

    ours, theirs = trained(params, True), trained(params, False)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6), (ours - theirs).abs().max()
    defaults = {"momentum": 0.9} if kind == "SGD" else {}  # dampening needs momentum
    assert not torch.allclose(ours, trained(defaults, False), rtol=1e-4, atol=1e-5)


def test_fp16_loss_scale_and_its_floor_reach_the_loss_scaler():
    """Catches fp16.loss_scale (a static scale) or fp16.min_loss_scale parsed and dropped:
    fp16 training whose scaled loss always overflows (2**40 x the loss is inf in fp16) keeps a
    static scale as given, and a dynamic one halves down to min_loss_scale and stops there (it
    would go on to 2**33 after 7 halvings without the floor)."""

    def scales(fp16, steps=8):
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 3)
        config = {
            "train_micro_batch_size_per_gpu": 4,
            "fp16": {"enabled": True, "hysteresis": 1, **fp16},
            "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 1},
        }
        engine = shardwise.zero.initialize(model, config)
        seen = []
        for _ in range(steps):
            x = torch.randn(4, 6).half()
            engine.backward(engine(x).float().pow(2).sum() + 1.0)
            engine.step()
            seen.append(engine.optimizer.loss_scale())
        return seen

    assert scales({"loss_scale": 2.0**40}) == [2.0**40] * 8
    floored = scales({"initial_scale_power": 40, "min_loss_scale": 2.0**37})
    assert floored[0] == 2.0**39 and floored[-1] == 2.0**37 and min(floored) == 2.0**37, floored


def _engine_lrs(scheduler: dict, steps: int) -> list[float]:
    """The lr of a shardwise engine configured with this DeepSpeed scheduler block: before its
    first step and after each."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "scheduler": scheduler,
        "zero_optimization": {"stage": 1},
    }
    engine = shardwise.zero.initialize(model, config)
    lrs = [engine.get_lr()[0]]
    for _ in range(steps):
        engine.backward(engine(torch.randn(4, 6)).pow(2).mean())
        engine.step()
        lrs.append(engine.get_lr()[0])
    return lrs


@pytest.mark.parametrize(
    "kind, params",
    [
        ("WarmupDecayLR", {"warmup_max_lr": 4e-3, "warmup_num_steps": 4, "total_num_steps": 12}),
        ("WarmupCosineLR", {"warmup_min_ratio": 0.2, "warmup_num_steps": 4, "total_num_steps": 12}),
        ("WarmupCosineLR", {"cos_min_ratio": 0.5, "warmup_num_steps": 2, "total_num_steps": 10}),
        ("WarmupLR", {"warmup_num_steps": 6, "last_batch_iteration": 2}),
    ],
)
def test_scheduler_params_from_the_config_set_the_engines_lr(kind, params):
    """Catches scheduler.params warmup_max_lr, warmup_min_ratio, cos_min_ratio or
    last_batch_iteration parsed and dropped: the engine's lr, step by step, is DeepSpeed's own
    scheduler's with these params, and not its lr with the key left out."""
    ours = _engine_lrs({"type": kind, "params": params}, 12)
    theirs = deepspeed_lrs(kind, params, 1e-2, 12)
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-18), (ours, theirs)
    key = next(k for k in params if k not in ("warmup_num_steps", "total_num_steps"))
    without = {k: v for k, v in params.items() if k != key}
    assert ours != pytest.approx(deepspeed_lrs(kind, without, 1e-2, 12), rel=1e-6), key


def test_fp16_loss_scale_window_grows_the_scale_as_deepspeeds_scaler():
    """Catches fp16.loss_scale_window parsed and dropped: with no overflow the engine's dynamic
    scale doubles every window steps exactly as DeepSpeed's DynamicLossScaler does with the
    same settings (window 2 doubles it 4 times in 9 steps; the default, 1000, never)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    def ours(window: int, steps: int = 9) -> list[float]:
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 3)
        fp16 = {"enabled": True, "initial_scale_power": 4, "hysteresis": 2}
        config = {
            "train_micro_batch_size_per_gpu": 4,
            "fp16": {**fp16, "loss_scale_window": window},
            "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 1},
        }
        engine = shardwise.zero.initialize(model, config)
        seen = []
        for _ in range(steps):
            engine.backward(engine(torch.randn(4, 6).half()).float().pow(2).mean())
            engine.step()
            seen.append(engine.optimizer.loss_scale())
        return seen

    scaler = DynamicLossScaler(2.0**4, 2, 1.0, 2, False)
    theirs = []
    for _ in range(9):
        scaler.update_scale(False)
        theirs.append(scaler.cur_scale)
    assert ours(2) == theirs and theirs[-1] == 2.0**8, (ours(2), theirs)
    assert ours(1000) == [2.0**4] * 9


def test_train_micro_batch_size_per_gpu_sets_the_loaders_batch():
    """Catches train_micro_batch_size_per_gpu parsed and dropped: deepspeed.initialize's loader
    yields batches of it (3 of 10 rows: 3, 3, 3 and the last 1, as DeepSpeed's loader), where
    train_batch_size=5 alone gives 5."""
    model = torch.nn.Linear(4, 2)
    data = torch.utils.data.TensorDataset(torch.randn(10, 4), torch.randn(10, 2))
    for config, sizes in (
        ({"train_micro_batch_size_per_gpu": 3}, [3, 3, 3, 1]),
        ({"train_batch_size": 5}, [5, 5]),
    ):
        config = {**config, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
        _, _, loader, _ = shardwise.deepspeed.initialize(
            model=model, model_parameters=model.parameters(), training_data=data, config=config
        )
        assert [len(x) for x, _ in loader] == sizes, config


def test_sgd_without_momentum_trains_as_torchs_sgd():
    """Catches ZeRO's SGD without momentum (DeepSpeed's and torch's default) failing at its
    first step: it handed the fused SGD a momentum buffer to update with momentum 0."""
    torch.manual_seed(0)
    batches = [(torch.randn(4, 6), torch.randn(4, 3)) for _ in range(4)]
    model = torch.nn.Linear(6, 3)
    reference = torch.nn.Linear(6, 3)
    reference.load_state_dict(model.state_dict())
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1, "weight_decay": 0.01}},
        "zero_optimization": {"stage": 2},
    }
    engine = shardwise.zero.initialize(model, config)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, weight_decay=0.01)
    for x, y in batches:
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        assert engine.step()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        opt.step()
        opt.zero_grad()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-7), (ours - theirs).abs().max()
