"""Models bundled with shardwise (used by the benchmarks and the training job)."""

from .gpt import GPT, PRESETS, GPTConfig

__all__ = ["GPT", "GPTConfig", "PRESETS"]
