"""Datasets in memory for ``shardwise.Trainer``: the batches of a map-style or iterable dataset
for one data rank, in the form the train step takes (inputs, targets ``[rows, seq_len]``).

Items
    An item is one training sequence, in any of the forms people hand to a trainer:

    * token ids (a 1-D integer tensor, NumPy array or list) of ``seq_len + 1`` tokens: the
      inputs are the first ``seq_len``, the targets the same shifted by one (as the corpus
      stream cuts its windows);
    * a mapping with ``input_ids`` (and ``labels``, default the ids), as a tokenized Hugging
      Face dataset yields: inputs ``input_ids[:-1]``, targets ``labels[1:]``, which is the shift
      a Hugging Face causal LM applies to its own ``labels`` (a label of -100 is ignored by the
      loss, as there);
    * a pair ``(inputs, targets)`` of two 1-D integer sequences of one length, already aligned.

    Every item of a dataset has one length; padded items mark their padding with label -100.

Order
    A map-style dataset (``__len__`` and ``__getitem__``: a list, a ``torch.utils.data.Dataset``,
    a ``datasets.Dataset``) is read in the order of the C++ ``BatchOrder`` (data/batch_order.h),
    the rule the corpus stream follows: shuffled per epoch from (seed, epoch), each global batch
    split among the data ranks, the remainder dropped. An iterable dataset is read in its own
    order (it shuffles itself, as torch's loaders leave it to); each run of ``rows × data ranks``
    items is a global batch, split by the same rule, and a new epoch iterates it again. The
    position (``state()``) is saved with the checkpoints, so a resumed run reads the next batch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence

import torch

from .. import _C

FORMS = (
    "token ids (a 1-D integer tensor, array or list of seq_len + 1 ids), a mapping with "
    "'input_ids' (and 'labels'), or a pair (inputs, targets) of one length"
)


def is_map_style(dataset) -> bool:
    """Whether ``dataset`` is read by index (``__len__`` and ``__getitem__``, not an
    ``IterableDataset``)."""
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return False
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


def check(dataset, name: str) -> int:
    """The sequence length (inputs per item) of ``dataset``, read off its first item; TypeError
    or ValueError naming ``name`` and the fix when it is not a dataset of one of the forms."""
    if isinstance(dataset, str | bytes | torch.Tensor) or not (
        is_map_style(dataset) or isinstance(dataset, Iterable)
    ):
        raise TypeError(
            f"{name}: {type(dataset).__name__} is not a dataset; give a map-style dataset "
            "(__len__ and __getitem__: a list, a torch Dataset, a datasets.Dataset) or an "
            f"iterable one, whose items are {FORMS}"
        )
    if is_map_style(dataset):
        if len(dataset) == 0:
            raise ValueError(f"{name} is empty; give it at least one global batch of items")
        first = dataset[0]
    else:
        first = next(iter(dataset), None)
        if first is None:
            raise ValueError(f"{name} yields no items; give it at least one global batch")
    inputs, _ = item_pair(first, f"{name}[0]")
    return int(inputs.numel())


def item_pair(item, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of one item, int64 1-D (see the module docstring)."""
    if isinstance(item, Mapping):
        if "input_ids" not in item:
            raise TypeError(
                f"{where} is a mapping without 'input_ids' (keys: {', '.join(map(str, item))}); "
                f"give items as {FORMS}"
            )
        ids = _ids(item["input_ids"], f"{where}['input_ids']")
        labels = item.get("labels")
        labels = ids if labels is None else _ids(labels, f"{where}['labels']")
        if labels.shape != ids.shape:
            raise ValueError(
                f"{where}: 'labels' has {labels.numel()} ids, 'input_ids' {ids.numel()}"
            )
        return _long_enough(ids[:-1], where), labels[1:]
    if isinstance(item, tuple) and len(item) == 2 and not isinstance(item[0], int):
        inputs, targets = _ids(item[0], f"{where}[0]"), _ids(item[1], f"{where}[1]")
        if inputs.shape != targets.shape:
            raise ValueError(
                f"{where}: inputs of {inputs.numel()} ids but targets of {targets.numel()}; "
                "an (inputs, targets) pair is aligned, one target per input"
            )
        return _long_enough(inputs, where), targets
    ids = _ids(item, where)
    return _long_enough(ids[:-1], where), ids[1:]


def _ids(value, where: str) -> torch.Tensor:
    try:
        ids = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{where} is a {type(value).__name__}; give {FORMS}") from None
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{where} holds {ids.dtype} values; token ids are integers ({FORMS})")
    if ids.dim() != 1:
        raise TypeError(
            f"{where} has shape {tuple(ids.shape)}; an item is one sequence of token ids (1-D): "
            f"give {FORMS}"
        )
    return ids.long()


def _long_enough(inputs: torch.Tensor, where: str) -> torch.Tensor:
    if inputs.numel() < 1:
        raise ValueError(f"{where} is too short to train on; an item needs two tokens or more")
    return inputs


def collate(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], where: str):
    """The rows of one batch stacked: (inputs, targets), each ``[rows, seq_len]``."""
    lengths = {int(x.numel()) for x, _ in pairs}
    if len(lengths) > 1:
        raise ValueError(
            f"{where}: items of different lengths {sorted(lengths)} in one batch; pad every "
            "item to one length (labels -100 where padded) or cut them to seq_len + 1 tokens"
        )
    return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])


class MapStream:
    """The batches of a map-style dataset for one data rank (the order: C++ ``BatchOrder``)."""

    def __init__(self, dataset, rows, data_rank, data_world, seed, shuffle=True, name="dataset",
                 contiguous=False, batches_per_step=1):  # fmt: skip
        self.dataset, self.name = dataset, name
        try:
            self._order = _C.BatchOrder(
                len(dataset), rows, data_rank, data_world, seed, shuffle, contiguous,
                batches_per_step,
            )  # fmt: skip
        except ValueError as error:
            raise ValueError(
                f"{name}: {error}; give more items or lower the micro-batch size"
            ) from None
        self.batches_per_epoch = self._order.batches_per_epoch

    def _read(self, items: torch.Tensor):
        where = f"{self.name}[{int(items[0])}]"
        return collate(
            [item_pair(self.dataset[int(i)], f"{self.name}[{int(i)}]") for i in items], where
        )

    def __iter__(self) -> MapStream:
        return self

    def __next__(self):
        return self._read(self._order.next())

    def batch(self, epoch: int, index: int):
        return self._read(self._order.batch_items(epoch, index))

    def state(self) -> dict:
        return {"epoch": self._order.epoch, "index": self._order.index}

    def load_state(self, state: Mapping) -> None:
        self._order.load_state(int(state["epoch"]), int(state["index"]))


class IterableStream:
    """The batches of an iterable dataset for one data rank: each ``rows × data_world`` items in
    the dataset's own order are a global batch, of which this rank reads its positions."""

    def __init__(self, dataset, rows, data_rank, data_world, name="dataset", contiguous=False,
                 batches_per_step=1):  # fmt: skip
        self.dataset, self.name, self.global_rows = dataset, name, rows * data_world
        self.batches_per_step = batches_per_step  # a pass ends on a whole training step
        # this rank's positions in a global batch: the BatchOrder rule, unshuffled
        self.positions = _C.BatchOrder(
            self.global_rows, rows, data_rank, data_world, 0, False, contiguous
        )
        self.positions = self.positions.batch_items(0, 0).tolist()
        self.epoch, self.index, self._items = 0, 0, None
        self._cache: list = []  # the first global batches, for eval (read the same each time)

    def _global_batches(self):
        chunk: list = []
        step: list = []  # a training step's global batches, yielded once all are there
        for item in self.dataset:
            chunk.append(item)
            if len(chunk) == self.global_rows:
                step.append(chunk)
                chunk = []
            if len(step) == self.batches_per_step:
                yield from step
                step = []

    def _read(self, chunk: list, number: int):
        pairs = [item_pair(chunk[p], f"{self.name} item {number * self.global_rows + p}")
                 for p in self.positions]  # fmt: skip
        return collate(pairs, f"{self.name} batch {number}")

    def __iter__(self) -> IterableStream:
        return self

    def __next__(self):
        if self._items is None:
            self._items = self._global_batches()
            for _ in range(self.index):  # resumed: skip what the saved run read
                next(self._items, None)
        chunk = next(self._items, None)
        if chunk is None:
            if self.index == 0:
                raise ValueError(
                    f"{self.name} yields fewer than one global batch ({self.global_rows} items); "
                    "give more items or lower the micro-batch size"
                )
            self.epoch, self.index, self._items = self.epoch + 1, 0, None
            return next(self)
        self.index += 1
        return self._read(chunk, self.index - 1)

    @functools.cached_property
    def batches_per_epoch(self) -> int:
        """Whole global batches in one pass (iterates the dataset once, the first time)."""
        return sum(1 for _ in self._global_batches())

    def batch(self, epoch: int, index: int):
        """Batch ``index`` of a pass (the same in every epoch: the dataset's own order)."""
        if len(self._cache) <= index:
            batches = self._global_batches()
            self._cache = [chunk for chunk, _ in zip(batches, range(index + 1), strict=False)]
            if len(self._cache) <= index:
                raise IndexError(
                    f"{self.name} has {len(self._cache)} global batches, not {index + 1}"
                )
        return self._read(self._cache[index], index)

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state(self, state: Mapping) -> None:
        self.epoch, self.index, self._items = int(state["epoch"]), int(state["index"]), None


def stream(dataset, rows, data_rank, data_world, seed, shuffle=True, name="dataset",
           contiguous=False, batches_per_step=1):  # fmt: skip
    """The batch stream of ``dataset`` for this data rank (``MapStream`` or
    ``IterableStream``); ``contiguous``: micro-batch ``data_rank`` of each global batch, and
    ``batches_per_step``: an epoch of whole training steps (C++ ``data/batch_order.h``,
    deterministic training)."""
    if is_map_style(dataset):
        return MapStream(dataset, rows, data_rank, data_world, seed, shuffle, name, contiguous,
                         batches_per_step)  # fmt: skip
    return IterableStream(dataset, rows, data_rank, data_world, name, contiguous,
                          batches_per_step)  # fmt: skip
