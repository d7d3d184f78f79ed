"""Training data for ``shardwise-train``: a real English corpus, a byte-level tokenizer and a
deterministic, resumable, per-data-rank batch stream.

Corpus
    The prose of CPython's own help topics (``pydoc_data.topics.topics``, the text behind
    ``help("FOR")`` and friends). It ships with every Python installation, so the bundled GPT
    trains on real English text with no download. The topics are joined in sorted-key order,
    separated by blank lines, so the text is identical for a given Python version.

Tokenizer
    UTF-8 bytes, vocabulary 256, so the GPT preset ``"tiny"`` (``vocab_size=256``) fits.
    ``decode`` uses ``errors="replace"`` because a model may emit byte sequences that are not
    valid UTF-8.

Split
    The last ``val_fraction`` (default 5%) of the token sequence is the validation set; the
    rest is training data. Splitting at the end (not at random) keeps every validation window
    out of every training window.

Stream
    The token sequence is cut into non-overlapping windows of ``seq_len + 1`` tokens starting
    at ``0, seq_len, 2 * seq_len, ...`` (inputs are the first ``seq_len`` tokens, targets the
    same window shifted by one). Every epoch the window starts are permuted with a generator
    seeded from ``(seed, epoch)`` only. Global batch ``b`` of the epoch is the permutation slice
    ``[b * micro_batch * W, (b + 1) * micro_batch * W)``, and data rank ``r`` takes positions
    ``r, r + W, r + 2W, ...`` of that slice, so the data ranks read disjoint windows whose union
    is the global batch (``contiguous``, deterministic training: rank ``r`` reads positions
    ``[r * micro_batch, (r + 1) * micro_batch)`` instead, micro-batch ``r`` of the slice, so
    a micro-batch's windows do not depend on ``W``). Every rank has the same number of
    batches per epoch (windows that do not fill a whole global batch are dropped; with
    ``batches_per_step``, a whole training step of that many global batches, so a deterministic
    run's epoch ends on the same window at every ``W``), which keeps collectives in lockstep.
    Pipeline
    stages of one data-parallel replica pass the same ``data_rank`` and therefore see the same
    batches. The position is ``state() == {"epoch": e, "index": i}`` (the next batch to
    produce); ``load_state`` restores it, so a resumed run continues with exactly the next batch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

import torch

from .. import _C

VOCAB_SIZE = 256


@functools.lru_cache(maxsize=1)
def load_corpus() -> str:
    """The CPython help-topic prose, joined in sorted-key order with blank lines between."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key].strip("\n") for key in sorted(topics)) + "\n"


class ByteTokenizer:
    """UTF-8 byte tokenizer: token ids are byte values 0..255."""

    vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of ``text`` as a 1-D ``torch.long`` tensor."""
        data = bytearray(text.encode("utf-8"))
        if not data:
            return torch.empty(0, dtype=torch.long)
        return torch.frombuffer(data, dtype=torch.uint8).long()

    def decode(self, ids: torch.Tensor | Iterable[int]) -> str:
        """Text of token ids; invalid UTF-8 becomes U+FFFD instead of raising."""
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def split_tokens(
    tokens: torch.Tensor, val_fraction: float = 0.05
) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation): the last ``val_fraction`` of ``tokens`` is the validation set."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_val = max(1, int(round(len(tokens) * val_fraction)))
    return tokens[:-n_val], tokens[-n_val:]


@functools.lru_cache(maxsize=4)
def corpus_splits(val_fraction: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) byte tokens of the bundled corpus, stored as ``torch.uint8``."""
    tokens = ByteTokenizer().encode(load_corpus()).to(torch.uint8)
    return split_tokens(tokens, val_fraction)


class TokenStream:
    """Endless (inputs, targets) batches of shape ``[micro_batch, seq_len]`` for one data rank.

    ``tokens`` is a 1-D integer tensor. Batches are ``torch.long`` on the CPU; move them to the
    device in the training loop. See the module docstring for the sharding scheme.
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        seq_len: int,
        micro_batch: int,
        data_rank: int = 0,
        data_world: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        contiguous: bool = False,
        batches_per_step: int = 1,
    ):
        # The stream is C++ (csrc/data/token_stream.h), so the C++ trainer reads the same
        # batches; it validates the arguments (ValueError naming the bad one).
        self._native = _C.TokenStream(
            tokens.reshape(-1), seq_len, micro_batch, data_rank, data_world, seed, shuffle,
            contiguous, batches_per_step,
        )  # fmt: skip
        self.batches_per_epoch = self._native.batches_per_epoch

    def window_order(self, epoch: int) -> torch.Tensor:
        """Window numbers of ``epoch`` in global order (same on every rank)."""
        return self._native.window_order(epoch)

    def batch_windows(self, epoch: int, index: int) -> torch.Tensor:
        """Window numbers this rank reads for batch ``index`` of ``epoch``."""
        return self._native.batch_windows(epoch, index)

    def batch(self, epoch: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of batch ``index`` of ``epoch`` without moving the position."""
        return self._native.batch(epoch, index)

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._native.next()

    def state(self) -> dict:
        """Position of the next batch: ``{"epoch": int, "index": int}``."""
        return {"epoch": self._native.epoch, "index": self._native.index}

    def load_state(self, state: Mapping) -> None:
        """Restores a position from ``state()``; the next batch is the one that followed it."""
        self._native.load_state(int(state["epoch"]), int(state["index"]))


def write_corpus(path: str) -> int:
    """Writes the bundled corpus's UTF-8 bytes to ``path`` (for the C++ trainer,
    ``examples/cpp/train_gpt``); returns the byte count."""
    data = load_corpus().encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


if __name__ == "__main__":  # python -m shardwise.train.data PATH
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m shardwise.train.data PATH  (writes the bundled corpus there)")
    print(f"wrote {write_corpus(sys.argv[1])} bytes to {sys.argv[1]}")
