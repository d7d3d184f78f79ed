"""torch FSDP's auto-wrap policies read by shardwise (``shardwise.fsdp.torch_args``): the units
equal the modules torch's own ``_recursive_wrap`` wraps, for ModuleWrapPolicy, the
transformer_auto_wrap_policy and size_based_auto_wrap_policy partials and a lambda policy; and
torch's enums and objects map to shardwise's settings or are refused naming the argument. No
process group: the training parity is tests/distributed/fsdp_checks.py."""

import functools
from pathlib import Path

import pytest
import torch
from shardwise.fsdp import ConfigError, precision, torch_args
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import (
    ModuleWrapPolicy,
    _recursive_wrap,
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.attn = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.blocks = nn.ModuleList([Block(32), Block(32), Block(16)])
        self.head = nn.Linear(32, 100)


def torch_wrapped(model: nn.Module, policy) -> list[str]:
    """The names torch's own recursion wraps (the wrapper records instead of wrapping)."""
    names = {id(m): n for n, m in model.named_modules()}
    wrapped = []

    def record(module, **_):
        wrapped.append(names[id(module)])
        return module

    _recursive_wrap(model, policy, record, set(), set(), only_wrap_children=True)
    return wrapped


POLICIES = {
    "transformer": functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}),
    "size_based": functools.partial(size_based_auto_wrap_policy, min_num_params=5000),
    "lambda": functools.partial(
        lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, nn.Sequential)
    ),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_callable_policies_wrap_what_torch_wraps(name):
    """Catches: a policy evaluated differently from torch (recurse flag, the remainder count)."""
    model = Model()
    ours = torch_args.wrap_names(model, POLICIES[name])
    assert sorted(ours) == sorted(torch_wrapped(model, POLICIES[name])) and ours, ours
    depths = [n.count(".") for n in ours]
    assert depths == sorted(depths, reverse=True)  # children first


def test_module_wrap_policy_wraps_every_instance():
    assert torch_args.wrap_names(Model(), ModuleWrapPolicy({Block})) == [
        "blocks.0",
        "blocks.1",
        "blocks.2",
    ]


def test_torch_enums_and_objects_map_to_shardwise_settings():
    """Catches: an enum read as the wrong strategy or prefetch, an offload flag dropped."""
    assert torch_args.strategy_name(ShardingStrategy.HYBRID_SHARD) == "hybrid_shard"
    assert torch_args.strategy_name(ShardingStrategy.NO_SHARD) == "no_shard"
    assert torch_args.prefetch_name(BackwardPrefetch.BACKWARD_POST) == "backward_post"
    assert torch_args.prefetch_name(None) == "none"
    assert torch_args.offload_flag(CPUOffload(offload_params=True)) is True
    assert torch_args.offload_flag(CPUOffload()) is False
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert precision.from_torch(mp) == precision.Precision(
        torch.bfloat16, torch.float32, None, False, True, (nn.modules.batchnorm._BatchNorm,)
    ), "torch's defaults: root inputs cast, units' not, BatchNorm in full precision"
    mp = MixedPrecision(
        param_dtype=torch.float16,
        cast_forward_inputs=True,
        cast_root_forward_inputs=False,
        _module_classes_to_ignore=(nn.LayerNorm,),
    )
    assert precision.from_torch(mp) == precision.Precision(
        torch.float16, None, None, True, False, (nn.LayerNorm,)
    )
    assert torch_args.device_of(1) == torch.device("cuda", 1)


@pytest.mark.parametrize(
    "call, words",
    [
        (
            lambda: torch_args.strategy_name(ShardingStrategy._HYBRID_SHARD_ZERO2),
            "sharding_strategy",
        ),
        (lambda: torch_args.wrap_names(Model(), "blocks"), "auto_wrap_policy"),
        (lambda: torch_args.offload_flag("yes"), "cpu_offload"),
        (lambda: precision.from_torch(torch.bfloat16), "MixedPrecision"),
    ],
)
def test_what_has_no_counterpart_is_refused_naming_it(call, words):
    with pytest.raises(ConfigError, match=words):
        call()


ACCELERATE = Path(__file__).resolve().parents[1] / "data" / "accelerate" / "fsdp.yaml"


def test_accelerates_fsdp_config_reads_as_the_fsdp_config_keys():
    """Catches (issue 17): Accelerate's fsdp_config (upper-case values, its own key names)
    refused, or read as other settings."""
    import yaml
    from shardwise.fsdp import FSDPConfig

    with pytest.warns(UserWarning, match="fsdp_cpu_ram_efficient_loading=True") as caught:
        cfg = FSDPConfig.from_mapping(yaml.safe_load(ACCELERATE.read_text())["fsdp_config"])
    assert "fsdp_use_orig_params" not in str(caught[0].message)  # true is what runs
    assert cfg.fsdp_sharding_strategy == "full_shard"
    assert cfg.fsdp_auto_wrap_policy == "transformer_auto_wrap"
    assert cfg.fsdp_backward_prefetch == "backward_pre"
    assert cfg.fsdp_state_dict_type == "sharded_state_dict"
    assert cfg.sync_module_states is True and cfg.fsdp_cpu_offload is False
    more = FSDPConfig.from_mapping(
        {
            "fsdp_sharding_strategy": 2,
            "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer, MLP",
            "fsdp_offload_params": True,
            "fsdp_backward_prefetch": "NO_PREFETCH",
            "fsdp_activation_checkpointing": True,
        }
    )
    assert more.fsdp_sharding_strategy == "shard_grad_op"
    assert more.fsdp_transformer_layer_cls == ("LlamaDecoderLayer", "MLP")
    assert more.fsdp_cpu_offload and more.gradient_checkpointing
    assert more.fsdp_backward_prefetch == "none"
    with pytest.raises(ConfigError, match="given twice"):
        FSDPConfig.from_mapping({"fsdp_offload_params": True, "fsdp_cpu_offload": False})


def test_accelerate_choices_with_no_counterpart_are_named():
    """Catches fsdp_use_orig_params=false, fsdp_version=2 and
    fsdp_cpu_ram_efficient_loading=true accepted without a word (nothing here changes for them):
    one warning names each, with what runs."""
    from shardwise.fsdp import FSDPConfig

    asks = {
        "fsdp_use_orig_params": False,
        "fsdp_version": 2,
        "fsdp_cpu_ram_efficient_loading": True,
    }
    with pytest.warns(UserWarning, match="accepted but ignored") as caught:
        FSDPConfig.from_mapping(asks)
    assert len(caught) == 1 and all(f"{k}=" in str(caught[0].message) for k in asks)


@pytest.mark.parametrize(
    "config, words",
    [
        ({"tensor_parallel_size": 4}, "tensor_parallel_size=4: shardwise.wrap does FSDP only"),
        ({"pipeline_parallel_size": 2}, "pipeline_parallel_size=2"),
        ({"use_zero": True}, "for ZeRO: shardwise.zero.initialize"),
        ({"num_microbatches": 4}, "num_microbatches has no effect"),
        ({"zero_stage": 2}, "zero_stage: shardwise.wrap does FSDP; for ZeRO"),
        ({"pipeline_schedule": "1f1b"}, "pipeline_schedule has no effect"),
    ],
)
def test_wrap_refuses_keys_it_would_silently_drop(config, words):
    """Catches (issue 17): shardwise.wrap(m, {"tensor_parallel_size": 4}) wrapping with FSDP
    alone and saying nothing."""
    import shardwise

    with pytest.raises(ConfigError, match=words):
        shardwise.wrap(nn.Linear(2, 2), config)
