"""Which submodules become FSDP units: the two policies of the config (``transformer_auto_wrap``
and ``size_based_auto_wrap``) as functions that return module names, children first."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn


def transformer_blocks(root: nn.Module, layer_cls: Iterable[str] = ()) -> list[str]:
    """Names of the transformer blocks: modules whose class name is in ``layer_cls``, or, when
    it is empty, every child of an ``nn.ModuleList`` (the usual ``layers``/``blocks``/``h``)."""
    wanted = set(layer_cls)
    names = []
    for name, module in root.named_modules():
        if not name:
            continue
        if wanted:
            if type(module).__name__ in wanted:
                names.append(name)
        elif isinstance(module, nn.ModuleList):
            names.extend(f"{name}.{child}" for child, _ in module.named_children())
    if wanted and not names:
        present = sorted({type(m).__name__ for m in root.modules()})
        raise ValueError(
            f"fsdp_transformer_layer_cls {sorted(wanted)} matches no module; classes in the "
            f"model: {', '.join(present)}"
        )
    return _children_first(root, names)


def size_based(root: nn.Module, min_num_params: int) -> list[str]:
    """FSDP's size-based policy, bottom-up: a module becomes a unit when the parameters not
    already taken by units below it number at least ``min_num_params`` (the root is never
    chosen: it holds whatever is left)."""
    chosen: list[str] = []

    def visit(name: str, module: nn.Module) -> int:
        remaining = sum(p.numel() for p in module.parameters(recurse=False))
        for child_name, child in module.named_children():
            remaining += visit(f"{name}.{child_name}" if name else child_name, child)
        if name and remaining >= min_num_params:
            chosen.append(name)
            return 0
        return remaining

    visit("", root)
    return chosen


def _children_first(root: nn.Module, names: list[str]) -> list[str]:
    order = {name: i for i, (name, _) in enumerate(root.named_modules())}
    return sorted(set(names), key=lambda n: -order[n])
