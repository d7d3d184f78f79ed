"""DeepSpeed's ``deepspeed.accelerator.get_accelerator()`` as scripts call it
(``from shardwise.deepspeed.accelerator import get_accelerator``): the device a rank trains
on, as DeepSpeed names it. CUDA when torch sees a GPU, else the CPU (DeepSpeed's CPU
accelerator's answers: one ``"cpu"`` device whatever the index, no fp16).

What it has (the calls DeepSpeed's examples and Hugging Face make): ``device_name``,
``current_device_name``, ``current_device``, ``device_count``, ``is_available``,
``set_device``, ``synchronize``, ``manual_seed``, ``manual_seed_all``,
``communication_backend_name`` (the backend shardwise starts: ``shardwise``, or NCCL for the
GPUs), ``is_bf16_supported``, ``is_fp16_supported``, ``empty_cache``, ``memory_allocated``,
``max_memory_allocated``, ``pin_memory``, ``on_accelerator``."""

from __future__ import annotations

import functools

import torch


class TorchAccelerator:
    """The calls above over torch's CUDA or CPU device."""

    def __init__(self, cuda: bool):
        self._name = "cuda" if cuda else "cpu"

    def device_name(self, device_index: int | None = None) -> str:
        if self._name == "cpu" or device_index is None:
            return self._name
        return f"cuda:{device_index}"

    def current_device(self) -> int:
        return torch.cuda.current_device() if self._name == "cuda" else 0

    def current_device_name(self) -> str:
        return self.device_name(self.current_device() if self._name == "cuda" else None)

    def device_count(self) -> int:
        return torch.cuda.device_count() if self._name == "cuda" else 1

    def is_available(self) -> bool:
        return True

    def set_device(self, device_index: int) -> None:
        if self._name == "cuda":
            torch.cuda.set_device(device_index)

    def synchronize(self, device_index: int | None = None) -> None:
        if self._name == "cuda":
            torch.cuda.synchronize(device_index)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)  # seeds every CUDA device too

    def communication_backend_name(self) -> str:
        return "nccl" if self._name == "cuda" else "shardwise"

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported() if self._name == "cuda" else True

    def is_fp16_supported(self) -> bool:
        return self._name == "cuda"

    def empty_cache(self) -> None:
        if self._name == "cuda":
            torch.cuda.empty_cache()

    def memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_allocated(device_index) if self._name == "cuda" else 0

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_allocated(device_index) if self._name == "cuda" else 0

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor.pin_memory() if self._name == "cuda" else tensor

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name


@functools.cache
def get_accelerator() -> TorchAccelerator:
    """The accelerator of this process (decided once, as DeepSpeed's)."""
    return TorchAccelerator(torch.cuda.is_available())
