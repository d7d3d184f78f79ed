import pytest
import shardwise
import torch

ISAS = ["scalar", "avx512", "avx512_bf16"]
AVAILABLE_ISAS = ISAS[: ISAS.index(shardwise.detected_cpu_isa()) + 1]

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(params=AVAILABLE_ISAS)
def cpu_isa(request):
    """Runs a test once per CPU instruction set this machine has, restoring the default after."""
    shardwise.set_cpu_isa(request.param)
    yield request.param
    shardwise.set_cpu_isa(None)


def load_train_config(*overrides, env=None, path=None):
    """A shardwise-train config from dotted overrides (and a YAML path), with an empty
    environment unless given: the tests' machine and launcher do not leak in."""
    from shardwise.train.config import load_config

    return load_config(path, list(overrides), env={} if env is None else env)


def train_config_error(*overrides, env=None, path=None) -> str:
    """The ValueError text the config gives."""
    with pytest.raises(ValueError) as info:
        load_train_config(*overrides, env=env, path=path)
    return str(info.value)
