"""An N-D device mesh over ``torch.distributed``: the rank layout comes from the C++
``MeshLayout`` (``csrc/mesh/``: tp innermost, pp outermost), and one process group is made per
group of every axis of size > 1, once, when the mesh is built. Built from a ``mesh_shape``
such as ``[[2, 2], ["fsdp", "tp"]]``, from sizes plus the distributed config's
``mesh_axis_names`` (``data``, ``model`` and ``pipeline`` are aliases of dp, tp and pp), or from
the distributed config's ``tensor_parallel_size`` / ``pipeline_parallel_size``."""

from __future__ import annotations

import torch.distributed as dist

from . import _C


def mesh_spec(value, names=None, key: str = "mesh_shape") -> tuple[str, list[int], list[str]]:
    """A mesh as a config writes it, ``[[sizes...], [axis names...]]`` (or sizes plus ``names``),
    as ``(key, sizes, names)``: only the value's shape is read here; the sizes and names are
    checked by the C++ layout (``MeshLayout``, ``ParallelLayout``), and errors name ``key``."""
    example = 'e.g. [[2, 1], ["fsdp", "tp"]]'
    if names is not None and value is not None and all(isinstance(s, int) for s in value):
        value = [list(value), list(names)]
    try:
        sizes, axes = value
        sizes, axes = list(sizes), [str(a) for a in axes]
    except (TypeError, ValueError):
        raise ValueError(
            f"{key}: invalid value {value!r}; write [[sizes...], [axis names...]], {example}"
        ) from None
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int):
            raise ValueError(f"{key}: size {size!r} in {value!r} must be a positive integer")
    return key, sizes, axes


class Mesh:
    """The mesh of the current world. ``group(axis, ...)`` is this rank's process group along
    one or more axes (None where they span a single rank), ``size(axis)`` and
    ``coordinate(axis)`` place this rank, ``describe()`` lists every axis's groups."""

    AXES = ("pp", "dp", "fsdp", "tp")

    def __init__(self, shape, names=None, *, world_size=None, rank=None, create_groups=True):
        key, sizes, names = mesh_spec(shape, names)
        world = world_size if world_size is not None else dist.get_world_size()
        try:
            layout = _C.MeshLayout(sizes, names, world)
        except ValueError as error:
            raise ValueError(f"{key}: {error}") from None
        self._start(layout, rank, create_groups)

    @classmethod
    def from_layout(cls, layout, *, rank=None, create_groups=True) -> Mesh:
        """The mesh of a ``MeshLayout`` already resolved (``ParallelLayout.layout(kind)``)."""
        mesh = cls.__new__(cls)
        mesh._start(layout, rank, create_groups)
        return mesh

    def _start(self, layout, rank, create_groups) -> None:
        self.rank = rank if rank is not None else dist.get_rank()
        self.layout = layout
        axes = [a for a in self.AXES if layout.size(a) > 1]
        self.shape = [[layout.size(a) for a in axes], axes]
        self._groups: dict[tuple[str, ...], object] = {}
        if create_groups:
            for axes in [("pp",), ("dp",), ("fsdp",), ("tp",), ("dp", "fsdp")]:
                self._make(axes)

    @classmethod
    def from_sizes(
        cls,
        world_size: int,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        data_kind="dp",
        **kwargs,
    ) -> Mesh:
        """The distributed config's fields: data = world / (tp × pp) along ``data_kind`` (dp or
        fsdp)."""
        tp, pp = tensor_parallel_size, pipeline_parallel_size
        if world_size % (tp * pp):
            raise ValueError(
                f"tensor_parallel_size × pipeline_parallel_size = {tp} × {pp} does not divide "
                f"world_size {world_size}; choose sizes whose product divides the world size"
            )
        sizes = [pp, world_size // (tp * pp), tp]
        return cls(sizes, ["pp", data_kind, "tp"], world_size=world_size, **kwargs)

    def _make(self, axes: tuple[str, ...]) -> None:
        if all(self.layout.size(a) == 1 for a in axes):
            return
        for ranks in self.layout.groups(list(axes)):
            group = dist.new_group(ranks) if dist.get_world_size() > 1 else dist.group.WORLD
            if self.rank in ranks:
                self._groups[axes] = group

    def size(self, *axes: str) -> int:
        out = 1
        for a in axes:
            out *= self.layout.size(_C.canonical_mesh_axis(a))
        return out

    def coordinate(self, axis: str) -> int:
        return self.layout.coordinate(self.rank, _C.canonical_mesh_axis(axis))

    def ranks(self, *axes: str) -> list[int]:
        return self.layout.group_of(self.rank, [_C.canonical_mesh_axis(a) for a in axes])

    def group(self, *axes: str):
        """This rank's process group along ``axes`` (e.g. ``group("tp")``, or
        ``group("dp", "fsdp")`` for the whole data dimension); None when it is one rank."""
        key = tuple(a for a in self.AXES if a in {_C.canonical_mesh_axis(x) for x in axes})
        if self.size(*key) == 1:
            return None
        if key not in self._groups:
            raise KeyError(f"no process group along {key}; groups exist for {list(self._groups)}")
        return self._groups[key]

    def describe(self) -> str:
        return self.layout.describe()

    def __repr__(self) -> str:
        return f"Mesh({self.shape}, rank={self.rank})"
