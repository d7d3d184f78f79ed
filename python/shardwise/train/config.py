"""The configuration of ``shardwise-train``: one YAML file plus dotted command-line overrides,
validated completely before any work starts.

Design:

* ``load_config(path, overrides)`` reads the YAML with OmegaConf, merges the overrides
  (``OmegaConf.from_dotlist``, so ``model.mesh_shape=[[2,1],["fsdp","tp"]]`` parses as a list)
  and hands the plain dict to ``validate``, a pure function (no ``torch.distributed`` call; the
  environment is an argument, ``os.environ`` by default).
* The shape of the file is four pydantic v2 models (``model``, ``data``, ``training``,
  ``distributed``) with extra keys forbidden. Their errors are rewritten as ``ValueError``s that
  name the dotted key, the bad value and the fix; an unknown key gets the closest known key as a
  "did you mean" suggestion.
* The sub-blocks that already have a validator are handed to it rather than re-modelled:
  ``distributed.fsdp`` (and the FSDP keys written flat under ``distributed:``, which are
  lifted into it) goes to ``shardwise.FSDPConfig``, ``distributed.zero`` to ``shardwise.zero``'s
  DeepSpeed-style loader, the pipeline schedule to the C++ schedule builder.
* The cross-field rules (the distributed config's rules, the mesh, the strategy, the
  batch split) run after the models are built. Values left out are resolved in place:
  ``world_size``/``rank``/``local_rank`` from torchrun's variables, the strategy from the mesh
  axes and sub-blocks, the mixed precision from ``bf16``/``mixed_precision``. The dump
  (``to_dict``/``to_yaml``) is therefore the config that actually ran, minus the per-process
  ``rank``/``local_rank``, and loads again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import ValidationError

from ..models.families import FAMILIES
from . import model_source, sources
from .config_rules import (
    _check_sub_blocks,
    _check_tensor_parallel,
    _check_training,
    _lift_flat_fsdp_keys,
    _resolve_device,
    _resolve_layout,
    _resolve_precision,
    _resolve_strategy,
)
from .config_schema import (  # noqa: F401  (the config's public names, importable from here)
    BACKENDS,
    FLAT_FSDP_KEYS,
    FSDP_KEYS,
    PRECISIONS,
    STRATEGIES,
    CheckpointSection,
    DataSection,
    DistributedSection,
    ModelSection,
    PipelineSection,
    ProfileSection,
    TrainConfig,
    TrainingSection,
    _explain,
    _known_paths,
    scale_learning_rate,
    schema_keys,
)


def load_config(
    path: str | None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cuda_devices: int | None = None,
) -> TrainConfig:
    """The validated config from a YAML file (or none) and dotted overrides such as
    ``training.micro_batch_size=8`` or ``model.mesh_shape=[[2,1],["fsdp","tp"]]``. A bare
    ``model=NAME`` replaces the model section with a preset or a model family. Raises
    ValueError naming the key, the value and the fix. ``env`` and ``cuda_devices`` describe the
    machine (default: this one; see ``validate``)."""
    return validate(read_mapping(path, overrides), env, cuda_devices)


def read_mapping(path: str | None, overrides: Sequence[str] = ()) -> dict:
    """The plain mapping of sections a YAML file (or none) and dotted overrides give, not yet
    validated (``load_config`` validates it; ``shardwise.Trainer`` first adds its sections)."""
    try:
        base = OmegaConf.load(path) if path else OmegaConf.create({})
    except (OSError, OmegaConfBaseException, yaml.YAMLError) as error:
        raise ValueError(f"cannot read the config file {path!r}: {error}") from error
    if not isinstance(OmegaConf.to_container(base), dict):
        raise ValueError(f"{path}: the config must be a mapping of sections (model, data, ...)")
    for item in overrides:
        selected = _model_selection(item)
        if selected is not None:
            base = _select_model(base, selected, item)
            continue
        if "=" not in item:
            raise ValueError(
                f"override {item!r} has no '='; write dotted.key=value, "
                f"e.g. training.micro_batch_size=8"
            )
        try:
            merged = OmegaConf.merge(base, OmegaConf.from_dotlist([item]))
        except (OmegaConfBaseException, yaml.YAMLError) as error:
            raise ValueError(
                f"override {item!r}: {error}; write overrides as dotted.key=value, "
                f"e.g. training.micro_batch_size=8"
            ) from error
        base = merged
    try:
        return OmegaConf.to_container(base, resolve=True)
    except OmegaConfBaseException as error:
        raise ValueError(f"config interpolation failed: {error}") from error


# Keys of the model section that place the model rather than describe it: a model selection
# keeps them.
_LAYOUT_MODEL_KEYS = ("mesh_shape",)


def _model_selection(item: str) -> dict | None:
    """The model section a bare ``model=NAME`` selects: a bundled GPT preset (``model.preset``)
    or a named model family (``model.hf_config``, ``models/families.py``); None for any other
    override."""
    key, sep, value = item.partition("=")
    if not sep or key.strip() != "model" or "[" in value or "{" in value:
        return None
    name = value.strip()
    return {"hf_config": name} if name in FAMILIES else {"preset": name}


def _select_model(base, selected: dict, item: str):
    """``model=NAME`` as a Hydra config-group selection: the model section becomes ``selected``
    (the layout keys the section held are kept), every other section stays, and the keys it
    replaced are printed (once per job: by the process of rank 0)."""
    model = OmegaConf.to_container(base).get("model") or {}
    if not isinstance(model, dict):
        model = {}
    kept = {k: model[k] for k in _LAYOUT_MODEL_KEYS if k in model}
    replaced = {k: v for k, v in model.items() if k not in kept and selected.get(k) != v}
    if replaced and os.environ.get("RANK", "0") == "0":
        listed = ", ".join(f"model.{k}={v}" for k, v in replaced.items())
        print(f"shardwise: {item} replaces the config's model section ({listed})", file=sys.stderr)
    merged = OmegaConf.to_container(base)
    merged["model"] = {**selected, **kept}
    return OmegaConf.create(merged)


def validate(
    data: Mapping,
    env: Mapping[str, str] | None = None,
    cuda_devices: int | None = None,
    model=None,
) -> TrainConfig:
    """The TrainConfig of a plain mapping; resolves the defaults that come from ``env``
    (torchrun's WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and
    from the machine's ``cuda_devices`` (default: ``torch.cuda.device_count()``). ``model``: an
    ``nn.Module`` the caller built, which the run trains instead of the model section's."""
    cfg, lifted = _parse(data)
    model_source.resolve(cfg, model)  # a Hugging Face, factory or given model: builder, shape
    sources.check_section(cfg)  # may set model.vocab_size from the tokenizer
    _resolve_precision(cfg)
    _resolve_distributed(cfg, env, cuda_devices)
    model_source.check_strategy(cfg)
    _check_tensor_parallel(cfg)
    _check_sub_blocks(cfg, lifted)
    _check_training(cfg)
    return cfg


def validate_distributed(
    fields: Mapping, env: Mapping[str, str] | None = None, cuda_devices: int | None = None
) -> DistributedSection:
    """The ``distributed`` section alone, checked by the rules that concern it alone (the
    layout, the device and backend, the strategy and its sub-blocks) and resolved as in a whole
    config: what ``shardwise.DistributedConfig`` runs on construction. The rules that need the
    model or the batch (tp sizes, the batch split) run when a Trainer has them."""
    cfg, lifted = _parse({"distributed": dict(fields)})
    _resolve_distributed(cfg, env, cuda_devices)
    _check_sub_blocks(cfg, lifted)
    return cfg.distributed


def _parse(data: Mapping) -> tuple[TrainConfig, list[str]]:
    if not isinstance(data, Mapping):
        raise ValueError(f"the config must be a mapping of sections, got {type(data).__name__}")
    data, lifted = _lift_flat_fsdp_keys(data)
    try:
        return TrainConfig.model_validate(data), lifted
    except ValidationError as error:
        raise ValueError(_explain(error.errors()[0])) from None


def _resolve_distributed(cfg, env, cuda_devices) -> None:
    _resolve_layout(cfg, os.environ if env is None else env)
    _resolve_device(cfg, cuda_devices)
    _resolve_strategy(cfg)
