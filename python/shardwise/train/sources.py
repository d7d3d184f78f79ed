"""Where ``shardwise-train``'s tokens come from: the ``data:`` section.

Formats (``data.format: auto`` picks by the path)
    text     a UTF-8 file, or a folder of ``.txt`` / ``.md`` / ``.rst`` / ``.text`` files (every
             file one document, in sorted path order), tokenized by ``data.tokenizer``;
    bin      nanoGPT's pre-tokenized files: raw ``data.dtype`` ids (uint16 by default). A folder
             holding ``train.bin`` (and ``val.bin``) is read as nanoGPT's data folder;
    npy      a NumPy array of integer ids (any shape, read flattened);
    json, csv, parquet, arrow
             Hugging Face ``datasets`` from local files (``.jsonl`` is json): the
             ``data.text_field`` column is tokenized, or a pre-tokenized ``input_ids`` column is
             used as it is.
    ``bin`` and ``npy`` files are memory-mapped and checked by the C++ reader
    (``csrc/data/token_file.h``): a truncated file or a header that does not match the bytes is
    refused before training.

Tokenizer (``data.tokenizer``)
    ``byte`` (UTF-8 bytes, vocabulary 256, the bundled GPT's), or a Hugging Face ``tokenizer.json``
    (the file, or a folder holding it) read with ``tokenizers``. Documents are joined with the
    tokenizer's end-of-text token when it has one (``<|endoftext|>``, ``</s>``, ...), else with a
    blank line.

Validation tokens
    ``data.val_path`` (any format above), else nanoGPT's ``val.bin`` beside ``train.bin``, else
    the last ``data.val_fraction`` of the tokens (``data.split_tokens``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .. import _C
from .data import ByteTokenizer, split_tokens

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
DATASET_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
DATASET_FORMATS[".arrow"] = "arrow"
FORMATS = ("auto", "text", "bin", "npy", "json", "csv", "parquet", "arrow")
END_OF_TEXT = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
PATH_FIX = (
    "give a text file or folder, a .bin or .npy token file, nanoGPT's data folder, or a "
    ".json/.jsonl/.csv/.parquet/.arrow dataset file"
)


class JsonTokenizer:
    """A Hugging Face ``tokenizer.json`` (``tokenizers``), with ByteTokenizer's interface."""

    def __init__(self, path: str | Path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ValueError(
                "data.tokenizer: a tokenizer.json needs the tokenizers package "
                "(pip install tokenizers), or use data.tokenizer: byte"
            ) from None
        path = Path(path).expanduser()
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(
                f"data.tokenizer: {file} does not exist; give a tokenizer.json (or the folder "
                "holding one), or byte"
            )
        try:
            self.tokenizer = Tokenizer.from_file(str(file))
        except Exception as error:  # tokenizers raises its own Exception subclass
            raise ValueError(f"data.tokenizer: {file} is not a tokenizer.json: {error}") from None
        self.path = file
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        ids = [self.tokenizer.token_to_id(t) for t in END_OF_TEXT]
        self.eos_id = next((i for i in ids if i is not None), None)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor(self.tokenizer.encode(text).ids, dtype=torch.long)

    def encode_documents(self, documents: Sequence[str]) -> torch.Tensor:
        """Every document's ids, joined by the end-of-text token (or a blank line's ids)."""
        separator = [self.eos_id] if self.eos_id is not None else self.tokenizer.encode("\n\n").ids
        separator = np.asarray(separator, np.int32)
        parts = []  # int32 arrays: no Python list of the whole corpus's ids
        for k, encoding in enumerate(self.tokenizer.encode_batch(list(documents))):
            if k:
                parts.append(separator)
            parts.append(np.asarray(encoding.ids, np.int32))
        return (
            torch.from_numpy(np.concatenate(parts)) if parts else torch.empty(0, dtype=torch.int32)
        )

    def decode(self, ids) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        return self.tokenizer.decode([int(i) for i in ids])


def _byte_documents(tokenizer: ByteTokenizer, documents: Sequence[str]) -> torch.Tensor:
    return tokenizer.encode("\n\n".join(documents)).to(torch.uint8)


def load_tokenizer(spec: str) -> ByteTokenizer | JsonTokenizer:
    """``byte`` or a tokenizer.json (file or folder)."""
    return ByteTokenizer() if spec == "byte" else JsonTokenizer(spec)


@functools.lru_cache(maxsize=8)
def cached_tokenizer(spec: str) -> ByteTokenizer | JsonTokenizer:
    return load_tokenizer(spec)


def nanogpt_folder(path: Path) -> bool:
    return path.is_dir() and (path / "train.bin").is_file()


def detect_format(path: str | Path, given: str = "auto", key: str = "data.path") -> str:
    """The format of ``path`` (``given`` unless auto); ValueError naming ``key`` when the path
    is missing or its format cannot be told."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ValueError(f"{key}: {path} does not exist; {PATH_FIX}")
    if given != "auto":
        return given
    if nanogpt_folder(path):
        return "bin"
    if path.is_dir():
        if not text_files(path):
            raise ValueError(f"{key}: the folder {path} holds no {'/'.join(TEXT_SUFFIXES)} files")
        return "text"
    suffix = path.suffix.lower()
    if suffix in (".bin", ".npy"):
        return suffix[1:]
    return DATASET_FORMATS.get(suffix, "text")


def text_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)


def _dataset_documents(path: Path, builder: str, text_field: str, key: str):
    """The ``text_field`` column (or a pre-tokenized ``input_ids`` column) of a local dataset."""
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"{key}: a {builder} dataset needs the datasets package (pip install datasets)"
        ) from None
    files = [str(p) for p in sorted(path.rglob(f"*.{builder}*"))] if path.is_dir() else [str(path)]
    table = datasets.load_dataset(builder, data_files=files, split="train")
    if text_field in table.column_names:
        return table[text_field], None
    if "input_ids" in table.column_names:
        return None, table["input_ids"]
    raise ValueError(
        f"{key}: {path} has columns {table.column_names}, none named {text_field!r} or "
        "'input_ids'; set data.text_field to the text column"
    )


def read_tokens(path, fmt: str, dtype: str, tokenizer, text_field: str, key: str) -> torch.Tensor:
    """The 1-D token tensor of ``path`` in format ``fmt`` (auto: ``detect_format``'s)."""
    fmt = detect_format(path, fmt, key)
    path = Path(path).expanduser()
    if fmt in ("bin", "npy"):
        file = path / "train.bin" if nanogpt_folder(path) else path
        try:
            return _C.read_token_file(str(file), dtype)
        except ValueError as error:
            raise ValueError(f"{key}: {error}") from None
    if fmt == "text":
        files = text_files(path) if path.is_dir() else [path]
        documents = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    else:
        documents, ids = _dataset_documents(path, fmt, text_field, key)
        if ids is not None:
            return torch.from_numpy(np.concatenate([np.asarray(row, np.int64) for row in ids]))
    if isinstance(tokenizer, ByteTokenizer):
        return _byte_documents(tokenizer, documents)
    return tokenizer.encode_documents(documents)


def train_val_tokens(data, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) tokens of a ``DataSection`` with a ``path``."""
    fields = (data.format, data.dtype, tokenizer, data.text_field)
    train = read_tokens(data.path, *fields, "data.path")
    if data.val_path:
        return train, read_tokens(data.val_path, *fields, "data.val_path")
    folder = Path(data.path).expanduser()
    if nanogpt_folder(folder) and (folder / "val.bin").is_file():
        return train, read_tokens(folder / "val.bin", "bin", data.dtype, None, "", "data.path")
    return split_tokens(train, data.val_fraction)


def token_ids(tokens: torch.Tensor) -> torch.Tensor:
    """Ids as int64, unsigned file types (uint16, uint32) widened without sign extension."""
    return _C.token_ids(tokens)


def check_vocabulary(tokens: torch.Tensor, vocab_size: int, key: str) -> tuple[int, int]:
    """(smallest, largest) id; ValueError naming ``key`` and model.vocab_size when an id is
    outside [0, vocab_size)."""
    low, high = _C.token_range(tokens)
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{key}: token ids span [{low}, {high}] but the model's vocabulary is {vocab_size}; "
            f"set model.vocab_size to at least {high + 1} (or the tokenizer the data was made with)"
        )
    return low, high


def check_section(cfg) -> None:
    """The config's data paths, formats and tokenizer, checked at validation (nothing is read
    but the tokenizer). A tokenizer larger than the model's vocabulary sets ``model.vocab_size``
    when it was left out (rounded up to a multiple of 64, as nanoGPT pads GPT-2's), else is an
    error naming it."""
    data = cfg.data
    if data.path is not None:
        detect_format(data.path, data.format)
    if data.val_path is not None:
        if data.path is None:
            raise ValueError("data.val_path needs data.path (the training data it validates)")
        detect_format(data.val_path, data.format, "data.val_path")
    if data.tokenizer == "byte":
        return
    vocab = cached_tokenizer(data.tokenizer).vocab_size
    shape = cfg.model._shape  # a Hugging Face or factory model: its own vocabulary
    if shape is not None and shape.vocab_size < vocab:
        raise ValueError(
            f"the model's vocabulary ({shape.vocab_size}) is smaller than data.tokenizer's "
            f"({vocab}); set vocab_size in model.hf_overrides or model.factory_args to {vocab}"
        )
    if shape is not None:
        return
    given = cfg.model.vocab_size
    if given is None and cfg.model.gpt().vocab_size < vocab:
        cfg.model.vocab_size = -(-vocab // 64) * 64
    elif given is not None and given < vocab:
        raise ValueError(
            f"model.vocab_size={given} is smaller than the vocabulary of data.tokenizer "
            f"({vocab} tokens); set model.vocab_size to at least {vocab}, or leave it out"
        )
