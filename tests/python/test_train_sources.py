"""Your own data for ``shardwise-train`` (``train/sources.py``, the C++ token-file reader): every
format against what NumPy, ``tokenizers`` and ``datasets`` themselves read, the validation
tokens, the tokenizer's vocabulary, and the errors that name the key and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from shardwise import _C
from shardwise.train import data as data_mod
from shardwise.train import sources
from shardwise.train.config import DataSection, load_config


def section(**kw) -> DataSection:
    return DataSection(**kw)


# --------------------------------------------------------------------------- token files


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_bin_files_read_as_numpy_reads_them(tmp_path, dtype):
    """nanoGPT's .bin: ids above the signed range of the width (40000 in uint16, 3e9 in uint32)
    must come back unsigned (a sign-extending widening turns them negative)."""
    top = 65535 if dtype == np.uint16 else 3_000_000_000
    ids = np.concatenate([np.arange(1000), [40000, top]]).astype(dtype)
    ids.tofile(tmp_path / "train.bin")
    name = np.dtype(dtype).name
    tokens = _C.read_token_file(str(tmp_path / "train.bin"), name)
    assert tokens.shape == (1002,)
    assert torch.equal(sources.token_ids(tokens), torch.from_numpy(ids.astype(np.int64)))
    assert _C.token_range(tokens) == (0, top)


def test_token_stream_reads_unsigned_files_bit_exactly(tmp_path):
    """The stream over a memory-mapped uint16 file gives the batches it gives over the same ids
    as int64 (the gather goes through a signed view of the same bytes)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 65536, size=5000).astype(np.uint16)
    ids.tofile(tmp_path / "t.bin")
    mapped = _C.read_token_file(str(tmp_path / "t.bin"), "uint16")
    wide = torch.from_numpy(ids.astype(np.int64))
    for rank in (0, 1):
        a = data_mod.TokenStream(mapped, 16, 3, rank, 2, seed=4)
        b = data_mod.TokenStream(wide, 16, 3, rank, 2, seed=4)
        for _ in range(a.batches_per_epoch + 2):  # into the second epoch
            (xa, ya), (xb, yb) = next(a), next(b)
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert int(wide.max()) > 32767


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32, np.int64])
def test_npy_files_read_as_numpy_loads_them(tmp_path, dtype):
    """.npy of every integer type and a 2-D shape (read flattened), as np.load reads it."""
    ids = (np.arange(600).reshape(20, 30) % 251).astype(dtype)
    np.save(tmp_path / "tokens.npy", ids)
    tokens = _C.read_token_file(str(tmp_path / "tokens.npy"))
    assert torch.equal(
        sources.token_ids(tokens), torch.from_numpy(ids.reshape(-1).astype(np.int64))
    )


def test_malformed_token_files_are_refused_naming_the_path(tmp_path):
    """A truncated .npy, a float array, and a .bin of odd size: refused before training."""
    np.save(tmp_path / "cut.npy", np.arange(100, dtype=np.uint16))
    data = (tmp_path / "cut.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(data[:-10])
    np.save(tmp_path / "float.npy", np.ones(10, dtype=np.float32))
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    for name, needle in (
        ("cut.npy", "truncated"),
        ("float.npy", "not a little-endian integer"),
        ("odd.bin", "not a whole number of uint16"),
    ):
        with pytest.raises(ValueError, match=needle) as info:
            sources.read_tokens(tmp_path / name, "auto", "uint16", None, "text", "data.path")
        assert name in str(info.value) and "data.path" in str(info.value)


# --------------------------------------------------------------------------- text and tokenizers


def test_text_file_and_folder_are_byte_tokens(tmp_path):
    """A folder: every text file one document, in sorted path order, joined by a blank line;
    files of other suffixes are left out."""
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.md").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "skip.py").write_text("print()")
    tok = data_mod.ByteTokenizer()
    got = sources.read_tokens(tmp_path, "text", "uint16", tok, "text", "data.path")
    assert tok.decode(got) == "first\n\nsecond"
    one = sources.read_tokens(tmp_path / "a.txt", "text", "uint16", tok, "text", "data.path")
    assert tok.decode(one) == "first"


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A real byte-level BPE tokenizer.json (tests/data/tokenizers/make_bpe400.py made it)."""
    return Path(__file__).resolve().parents[1] / "data" / "tokenizers" / "bpe400" / "tokenizer.json"


def test_tokenizer_json_encodes_as_tokenizers_does(bpe_tokenizer, tmp_path):
    """Documents tokenized by ``tokenizers`` itself, joined by <|endoftext|>, and decoded back."""
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(bpe_tokenizer))
    tok = sources.load_tokenizer(str(bpe_tokenizer.parent))  # the folder holding it
    assert tok.vocab_size == ref.get_vocab_size() and tok.eos_id == ref.token_to_id("<|endoftext|>")
    (tmp_path / "a.txt").write_text("The for statement")
    (tmp_path / "b.txt").write_text("is used to iterate")
    got = sources.read_tokens(tmp_path, "text", "uint16", tok, "text", "data.path").tolist()
    a, b = ref.encode("The for statement").ids, ref.encode("is used to iterate").ids
    assert got == a + [tok.eos_id] + b
    assert tok.decode(torch.tensor(a)) == "The for statement"


def test_a_tokenizer_sets_the_vocabulary_or_names_it(bpe_tokenizer):
    """Left out, model.vocab_size becomes the tokenizer's rounded up to 64; given too small, it
    is an error naming it."""
    cfg = load_config(None, [f"data.tokenizer={bpe_tokenizer}"], env={})
    assert cfg.model.vocab_size == 448 and cfg.gpt_config().vocab_size == 448
    with pytest.raises(ValueError, match="model.vocab_size=300 is smaller"):
        load_config(None, [f"data.tokenizer={bpe_tokenizer}", "model.vocab_size=300"], env={})
    with pytest.raises(ValueError, match="data.tokenizer: .* does not exist"):
        load_config(None, ["data.tokenizer=/nonexistent/tokenizer.json"], env={})


# --------------------------------------------------------------------------- datasets


def test_local_datasets_as_the_datasets_library_reads_them(tmp_path):
    """jsonl, csv and parquet through ``datasets.load_dataset``: the text column tokenized, a
    pre-tokenized ``input_ids`` column used as it is, a missing column named with the ones
    there are."""
    import datasets

    rows = [{"text": "alpha beta", "n": 1}, {"text": "gamma", "n": 2}]
    with open(tmp_path / "d.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    table = datasets.Dataset.from_list(rows)
    table.to_csv(str(tmp_path / "d.csv"), index=False)
    table.to_parquet(str(tmp_path / "d.parquet"))
    tok = data_mod.ByteTokenizer()
    for name in ("d.jsonl", "d.csv", "d.parquet"):
        fmt = sources.detect_format(tmp_path / name)
        got = sources.read_tokens(tmp_path / name, fmt, "uint16", tok, "text", "data.path")
        assert tok.decode(got) == "alpha beta\n\ngamma", name
    with pytest.raises(ValueError, match=r"none named 'body'.*data.text_field"):
        sources.read_tokens(tmp_path / "d.jsonl", "json", "uint16", tok, "body", "data.path")
    with open(tmp_path / "ids.jsonl", "w") as f:
        f.write('{"input_ids": [5, 6, 7]}\n{"input_ids": [8]}\n')
    got = sources.read_tokens(tmp_path / "ids.jsonl", "json", "uint16", tok, "text", "data.path")
    assert got.tolist() == [5, 6, 7, 8]


# --------------------------------------------------------------------------- splits and config


def test_nanogpt_folder_uses_its_val_bin(tmp_path):
    np.arange(0, 3000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.arange(5000, 5100, dtype=np.uint16).tofile(tmp_path / "val.bin")
    train, val = sources.train_val_tokens(section(path=str(tmp_path)), None)
    assert train.numel() == 3000 and sources.token_ids(val).tolist() == list(range(5000, 5100))


def test_val_path_or_the_last_fraction(tmp_path):
    tok = data_mod.ByteTokenizer()
    (tmp_path / "t.txt").write_text("x" * 1000)
    (tmp_path / "v.txt").write_text("y" * 50)
    train, val = sources.train_val_tokens(
        section(path=str(tmp_path / "t.txt"), val_path=str(tmp_path / "v.txt")), tok
    )
    assert train.numel() == 1000 and tok.decode(val) == "y" * 50
    train, val = sources.train_val_tokens(
        section(path=str(tmp_path / "t.txt"), val_fraction=0.1), tok
    )
    assert (train.numel(), val.numel()) == (900, 100)


def test_ids_beyond_the_vocabulary_are_named():
    with pytest.raises(ValueError, match=r"span \[0, 300\].*model.vocab_size to at least 301"):
        sources.check_vocabulary(torch.tensor([0, 300], dtype=torch.int32), 256, "data.path")


def test_bad_data_paths_are_refused_at_validation(tmp_path):
    with pytest.raises(ValueError, match="data.path: .*does not exist; give a text file"):
        load_config(None, [f"data.path={tmp_path / 'missing'}"], env={})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .txt"):
        load_config(None, [f"data.path={tmp_path / 'empty'}"], env={})
    with pytest.raises(ValueError, match="data.val_path needs data.path"):
        load_config(None, [f"data.val_path={tmp_path}"], env={})
    with pytest.raises(ValueError, match="data.dtype"):
        load_config(None, ["data.dtype=float16"], env={})


def test_data_format_dtype_and_text_field_keys_decide_the_tokens(tmp_path):
    """The data keys as a config gives them, read by the trainer's own ``train_val_tokens``:
    data.dtype=uint8 reads a .bin file's bytes where the default (uint16) reads half as many
    ids; data.format=text reads the same file as UTF-8 text (byte tokens); data.text_field
    picks the column of a jsonl dataset. Each key set to its other value changes the tokens."""
    ids = np.arange(1000, 1400, dtype=np.uint16)
    ids.tofile(tmp_path / "tokens.bin")
    with open(tmp_path / "d.jsonl", "w") as f:
        f.writelines(json.dumps({"text": "alpha", "title": "omega"}) + "\n" for _ in range(20))
    tok = data_mod.ByteTokenizer()

    def tokens(*overrides: str) -> torch.Tensor:
        cfg = load_config(None, ["data.val_fraction=0.1", *overrides], env={})
        train, val = sources.train_val_tokens(cfg.data, tok)
        return sources.token_ids(torch.cat([train, val]))

    path = f"data.path={tmp_path / 'tokens.bin'}"
    assert tokens(path).tolist() == ids.tolist()
    as_bytes = ids.view(np.uint8).astype(np.int64).tolist()
    assert tokens(path, "data.dtype=uint8").tolist() == as_bytes
    assert tokens(path, "data.format=text").numel() > 400  # decoded text, not 400 uint16 ids
    assert tokens(path, "data.format=text").tolist() != ids.tolist()
    jsonl = f"data.path={tmp_path / 'd.jsonl'}"
    assert tok.decode(tokens(jsonl)).startswith("alpha\n\nalpha")
    assert tok.decode(tokens(jsonl, "data.text_field=title")).startswith("omega\n\nomega")
