"""Training from Python: ``shardwise.Trainer`` and ``shardwise.DistributedConfig``.

``Trainer(model, train_dataset, eval_dataset=None, config=...)`` trains any ``nn.Module`` whose
forward maps token ids to logits (or a Hugging Face causal LM) on any map-style or iterable
dataset of token sequences (``datasets.py``), with every strategy, checkpoint, metric and plot
of ``shardwise-train``, which is this class's caller::

    trainer = shardwise.Trainer(model, train_ds, val_ds, config="examples/configs/fsdp.yaml")
    metrics = trainer.train()

The config is a YAML path, a mapping of sections, a ``TrainConfig`` or nothing (the defaults);
``model_config``, ``training_config``, ``distributed_config`` (and ``data_config``) replace the
keys they give in their section, as the distributed-config guide writes
``Trainer(model_config=..., training_config=..., distributed_config=...).train(train_ds,
val_ds)``. Everything is validated before any process group starts: the config's rules, the
model's type, each dataset's first item (its form and length, which is the sequence length)
and the memory plan. The run then goes as the command's: the process group from torchrun's
environment (or a one-rank group), the transforms over rank 0's weights, the loop, the
checkpoints and the export in ``training.checkpoint.dir``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, PrivateAttr, ValidationError
from torch import nn

from . import config_plan, datasets, prediction
from .config import TrainConfig, read_mapping, validate, validate_distributed
from .config_schema import DistributedSection, _explain
from .device import device_memory_bytes
from .trainer import TrainingRun

SECTIONS = ("model", "data", "training", "distributed")


class DistributedConfig(DistributedSection):
    """The ``distributed`` section as a Python object, checked on construction by the rules a
    config file's section gets (world_size == num_nodes × num_processes_per_node, tp × pp <=
    world_size, rank < world_size, the mesh, the strategy and its blocks; ValueError naming the
    field and the fix), the values left out resolved from torchrun's environment::

        config = shardwise.DistributedConfig(world_size=4, mesh_shape=(2, 2),
                                             mesh_axis_names=("dp", "tp"))
        config.get_data_parallel_size()  # 2
    """

    _given: dict = PrivateAttr(default_factory=dict)

    def __init__(self, **fields):
        try:
            super().__init__(**fields)
        except ValidationError as error:
            first = error.errors()[0]
            raise ValueError(_explain({**first, "loc": ("distributed", *first["loc"])})) from None
        given = self.model_dump(exclude_unset=True)
        resolved = validate_distributed(given)
        for name in type(self).model_fields:
            object.__setattr__(self, name, getattr(resolved, name))
        self._given = given
        self._launch_given = resolved._launch_given

    def given(self) -> dict:
        """The fields given to the constructor (what a Trainer's config takes from it)."""
        return dict(self._given)


class MemoryCheckError(ValueError):
    """The memory planner says the run will not fit; ``note`` holds its lines."""

    def __init__(self, note: str):
        super().__init__(
            f"refusing a run that will not fit: {note} (pass check_memory=False, or "
            "--ignore-memory-check, to run anyway)"
        )
        self.note = note


class Trainer:
    """See the module docstring."""

    def __init__(
        self,
        model: nn.Module | None = None,
        train_dataset=None,
        eval_dataset=None,
        config: TrainConfig | Mapping | str | Path | None = None,
        *,
        model_config=None,
        data_config=None,
        training_config=None,
        distributed_config=None,
        resume: bool = True,
        check_memory: bool = True,
    ):
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(
                f"model: {type(model).__name__} is not a torch.nn.Module; pass the model "
                "itself (or None to build the one the config's model section names)"
            )
        self.model, self.resume, self.check_memory = model, resume, check_memory
        sections = (model_config, data_config, training_config, distributed_config)
        self._data = _merged(_base_mapping(config), dict(zip(SECTIONS, sections, strict=True)))
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        given = (model, train_dataset, eval_dataset, *sections)
        if isinstance(config, TrainConfig) and all(x is None for x in given):
            self.config = config  # validated already (load_config): nothing to add
        else:
            self.config = self._validated()

    def _validated(self) -> TrainConfig:
        """The whole config, validated with the model and the datasets' sequence length."""
        data = {k: dict(v) for k, v in self._data.items()}
        data.setdefault("data", {})
        if self.train_dataset is not None:
            if data["data"].get("path") is not None:
                raise ValueError(
                    "data.path and train_dataset both give the training data; give one"
                )
            seq = datasets.check(self.train_dataset, "train_dataset")
            if self.eval_dataset is not None:
                given = datasets.check(self.eval_dataset, "eval_dataset")
                if given != seq:
                    raise ValueError(
                        f"eval_dataset's items have {given} inputs, train_dataset's {seq}; give "
                        "both datasets one sequence length"
                    )
            if data["data"].setdefault("seq_len", seq) != seq:
                raise ValueError(
                    f"data.seq_len={data['data']['seq_len']} but train_dataset's items have "
                    f"{seq} inputs (seq_len + 1 tokens); drop data.seq_len or cut the items"
                )
        elif self.eval_dataset is not None:
            raise ValueError("eval_dataset without train_dataset; give the training data too")
        elif self.model is not None:
            raise ValueError(
                "a model without train_dataset: give the data it trains on (the config's "
                "bundled corpus is cut for the bundled GPT's vocabulary, not a given model's)"
            )
        return validate(data, model=self.model)

    def train(self, train_dataset=None, eval_dataset=None) -> dict:
        """Runs the training (collective: every rank calls it); returns the last step's
        metrics (loss, val_loss, tokens_per_s...) and, on rank 0, the export's path.
        Datasets given here replace those given to the constructor."""
        if train_dataset is not None or eval_dataset is not None:
            self.train_dataset = train_dataset if train_dataset is not None else self.train_dataset
            self.eval_dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
            self.config = self._validated()
        note, predicted = self.memory_plan()
        return TrainingRun(
            self.config, self.resume, note, self.train_dataset, self.eval_dataset, predicted
        ).run()

    def memory_plan(self) -> tuple[str, prediction.Prediction | None]:
        """The planner's lines for this run and, on rank 0 (which prints), its predicted step
        (``prediction.for_config``; None where it cannot be made, said in the lines);
        MemoryCheckError when the run will not fit (unless ``check_memory=False``)."""
        cfg = self.config
        local = cfg.distributed.num_processes_per_node or cfg.distributed.world_size
        device_bytes = device_memory_bytes(local, cfg.training.device)
        plan = config_plan.plan_for_config(cfg, device_bytes)
        fits, note = _memory_lines(cfg, plan, device_bytes)
        if not fits and self.check_memory:
            raise MemoryCheckError(note)
        if cfg.distributed.rank != 0:  # rank 0 alone prints the prediction and the comparison
            return note, None
        try:
            return note, prediction.for_config(cfg, plan)
        except ValueError as error:
            return f"{note}\nno step-time prediction: {error}", None


def _base_mapping(config) -> dict:
    """The config argument as a mapping of sections."""
    if config is None:
        return {}
    if isinstance(config, TrainConfig):
        return config.to_dict()
    if isinstance(config, str | Path):
        return read_mapping(str(config))
    if isinstance(config, Mapping):
        return {k: dict(v) if isinstance(v, Mapping) else v for k, v in config.items()}
    raise TypeError(
        f"config: {type(config).__name__} is not a config; give a YAML path, a mapping of "
        "sections, or a shardwise.train.config.TrainConfig"
    )


def _merged(base: dict, sections: dict) -> dict:
    """``base`` with each given section's keys replaced (a section object: the fields it was
    given; a mapping: its keys)."""
    out = dict(base)
    for name, section in sections.items():
        if section is None:
            continue
        if isinstance(section, DistributedConfig):
            keys = section.given()
        elif isinstance(section, BaseModel):
            keys = section.model_dump(exclude_unset=True)
        elif isinstance(section, Mapping):
            keys = dict(section)
        else:
            raise TypeError(
                f"{name}_config: {type(section).__name__} is not a section; give a mapping of "
                f"the {name} section's keys"
                + (" or a shardwise.DistributedConfig" if name == "distributed" else "")
            )
        out[name] = {**(out.get(name) or {}), **keys}
    return out


def memory_check(cfg: TrainConfig, device_bytes: int) -> tuple[bool, str]:
    """(fits, the planner's lines for this run's strategy) per rank (``plan_for_config``, the
    same plan ``shardwise-plan --config`` prints)."""
    return _memory_lines(cfg, config_plan.plan_for_config(cfg, device_bytes), device_bytes)


def _memory_lines(cfg: TrainConfig, plan, device_bytes: int) -> tuple[bool, str]:
    tp = cfg.distributed.tensor_parallel_size
    row = config_plan.config_row(cfg, plan)
    gib = 1024**3
    text = (
        (f"tensor parallel {tp}: " if tp > 1 else "")
        + f"memory per rank ({row.label}): parameters {row.parameters / gib:.3f} GiB, gradients "
        f"{row.gradients / gib:.3f} GiB, optimizer {row.optimizer_state / gib:.3f} GiB, "
        f"activations {row.activations / gib:.3f} GiB; total × {plan.overhead} = "
        f"{row.required / gib:.3f} GiB of {device_bytes / gib:.1f} GiB"
        f"; planner recommends {plan.recommendation.strategy}: {plan.recommendation.reason}"
    )
    return row.fits, text
