"""What a run costs, for the metrics of every logged step (``training.device_hour_price``).

A run holds ``devices`` devices for as long as it trains: each rank's GPU, or on the CPU each
rank's process (the unit a CPU job is billed and scheduled by). So, from the wall time since
this run's loop started (``elapsed_s``, measured on rank 0):

    device_hours           = elapsed_s * devices / 3600
    cost                   = device_hours * device_hour_price       (None without a price)
    tokens_per_device_hour = tokens / device_hours                  (tokens trained since then)

A resumed run counts from its own start: the figures are this run's, as its processes were
billed; the checkpoint's earlier steps were paid for by the run that trained them."""

from __future__ import annotations

import time


class RunCost:
    """The figures above, updated as the run trains."""

    def __init__(self, devices: int, price: float | None):
        self.devices, self.price = devices, price
        self.start = time.perf_counter()
        self.tokens = 0

    def record(self, tokens: int) -> dict:
        """The fields of a step's record after it trained ``tokens`` more tokens."""
        self.tokens += tokens
        elapsed = time.perf_counter() - self.start
        device_hours = elapsed * self.devices / 3600
        return {
            "elapsed_s": elapsed,
            "tokens_seen": self.tokens,
            "device_hours": device_hours,
            "cost": None if self.price is None else device_hours * self.price,
            "tokens_per_device_hour": self.tokens / device_hours if device_hours > 0 else None,
        }
