"""Tests of ``shardwise.train.checkpoint``: atomic per-rank saves with a manifest, fallback to
the newest intact checkpoint, pruning, safetensors export and the SIGTERM flag."""

import os
import signal
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from shardwise.train import checkpoint as ckpt

CONFIG = "model:\n  preset: tiny\ntrain:\n  steps: 10\n"


def _payload(rank, step):
    return {
        "model": {"w": torch.full((4, 3), float(rank + step))},
        "optim": {"step": step, "exp_avg": [torch.arange(3) * rank], "lr": 1e-3},
        "data": {"epoch": 0, "index": step},
        "name": f"rank{rank}",
        "flag": True,
        "none": None,
    }


def _save_all(directory, step, world=2, keep_last=3):
    for rank in reversed(range(world)):  # rank 0 last: it writes the manifest
        out = ckpt.save(directory, step, _payload(rank, step), rank, world, CONFIG, keep_last)
    return out


def _latest_quietly(directory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ckpt.CheckpointWarning)
        return ckpt.latest(directory)


def _leftover_temp_files(directory):
    return [p for p in Path(directory).rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]


def test_round_trip_two_ranks(tmp_path):
    assert ckpt.latest(tmp_path) is None
    step_dir = _save_all(tmp_path, 7)
    assert step_dir == tmp_path / "step-00000007"
    assert ckpt.latest(tmp_path) == step_dir
    for rank in range(2):
        got = ckpt.load(step_dir, rank)
        want = _payload(rank, 7)
        assert torch.equal(got["model"]["w"], want["model"]["w"])
        assert torch.equal(got["optim"]["exp_avg"][0], want["optim"]["exp_avg"][0])
        assert got["data"] == want["data"] and got["name"] == f"rank{rank}"
        assert got["flag"] is True and got["none"] is None
    manifest = ckpt.read_manifest(step_dir)
    assert manifest["step"] == 7 and manifest["world_size"] == 2
    assert manifest["config_yaml"] == CONFIG
    assert sorted(manifest["files"]) == ["rank-00000.pt", "rank-00001.pt"]
    assert len(manifest["files"]["rank-00001.pt"]["sha256"]) == 64
    assert not _leftover_temp_files(tmp_path)


def test_records_gathered_before_the_manifest_and_barrier_after_it(tmp_path):
    """The gather of every rank's file record runs once the files exist and before the
    manifest, the barrier after it; the manifest holds the gathered hash (rank 0 does not hash
    a reported file again) and a report of another size than the file is refused."""
    seen = []
    manifest = tmp_path / "step-00000001" / "manifest.json"

    def gather(record):
        seen.append(("gather", manifest.exists(), record[0]))
        return [record]

    def barrier():
        seen.append(("barrier", manifest.exists()))

    ckpt.save(tmp_path, 1, _payload(0, 1), 0, 1, CONFIG, 2, barrier=barrier, gather=gather)
    assert seen == [("gather", False, 0), ("barrier", True)]
    step_dir = tmp_path / "step-00000001"
    size = (step_dir / "rank-00000.pt").stat().st_size
    ckpt.save(tmp_path, 2, _payload(0, 2), 0, 1, CONFIG, 2, gather=lambda r: [(0, r[1], "0" * 64)])
    assert (
        ckpt.read_manifest(tmp_path / "step-00000002")["files"]["rank-00000.pt"]["sha256"]
        == "0" * 64
    )
    with pytest.raises(OSError, match="rank 0 reported writing"):
        ckpt.save(
            tmp_path, 3, _payload(0, 3), 0, 1, CONFIG, 2, gather=lambda r: [(0, size + 1, r[2])]
        )
    assert (step_dir / "manifest.json").exists() and ckpt.verify(step_dir) is None


def test_keep_last_deletes_older_checkpoints(tmp_path):
    for step in (10, 20, 30, 40):
        _save_all(tmp_path, step, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000030", "step-00000040"]
    assert ckpt.latest(tmp_path) == tmp_path / "step-00000040"


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_newest_falls_back_with_warning(tmp_path, damage):
    _save_all(tmp_path, 1)
    newest = _save_all(tmp_path, 2)
    victim = newest / "rank-00001.pt"
    raw = bytearray(victim.read_bytes())
    if damage == "truncate":
        victim.write_bytes(bytes(raw[: len(raw) // 2]))
    else:
        raw[len(raw) // 2] ^= 0xFF
        victim.write_bytes(bytes(raw))
    with pytest.warns(ckpt.CheckpointWarning) as record:
        found = ckpt.latest(tmp_path)
    assert found == tmp_path / "step-00000001"
    message = str(record[0].message)
    assert str(victim) in message
    assert ("truncated" if damage == "truncate" else "SHA-256") in message
    assert ckpt.load(found, 1)["data"]["index"] == 1


def test_checkpoint_without_manifest_is_ignored(tmp_path):
    _save_all(tmp_path, 1)
    crashed = tmp_path / "step-00000002"
    crashed.mkdir()
    for rank in range(2):  # rank files only: the crash came before rank 0's manifest
        torch.save(_payload(rank, 2), crashed / ckpt.rank_file_name(rank))
    with pytest.warns(ckpt.CheckpointWarning, match="manifest.json missing"):
        assert ckpt.latest(tmp_path) == tmp_path / "step-00000001"
    # the next save prunes the incomplete leftover but keeps the good checkpoint
    _save_all(tmp_path, 3, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001", "step-00000003"]


def test_unloadable_payload_is_rejected_before_writing(tmp_path):
    _save_all(tmp_path, 1)
    with pytest.raises(TypeError, match=r"payload\['fn'\]"):
        ckpt.save(tmp_path, 2, {"fn": lambda: 0}, 0, 1, CONFIG, 1)
    assert not (tmp_path / "step-00000002" / "rank-00000.pt").exists()
    assert ckpt.latest(tmp_path) == tmp_path / "step-00000001"


def test_crash_while_writing_leaves_previous_intact_and_no_temp_files(tmp_path, monkeypatch):
    _save_all(tmp_path, 1)
    before = {p: p.read_bytes() for p in (tmp_path / "step-00000001").iterdir()}

    def failing_save(obj, f):
        f.write(b"partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save(tmp_path, 2, _payload(0, 2), 0, 1, CONFIG, keep_last=1)
    monkeypatch.undo()
    assert not _leftover_temp_files(tmp_path)
    assert not list((tmp_path / "step-00000002").iterdir())
    assert {p: p.read_bytes() for p in (tmp_path / "step-00000001").iterdir()} == before
    assert _latest_quietly(tmp_path) == tmp_path / "step-00000001"


def test_temporary_files_of_killed_writers_are_removed_and_nothing_else(tmp_path):
    """Catches (found by the fault soak): a rank SIGKILLed inside an atomic write leaves its
    temporary file, which no one removed; the next run's clean-up must delete exactly those (the
    Python and the C++ writers' names) and leave the checkpoints and other files alone."""
    step_dir = _save_all(tmp_path, 4)
    left = [
        step_dir / ".rank-00000.pt.k2j3h4.tmp",  # atomic_write_path (Python)
        step_dir / "manifest.json.tmp.4242",  # atomic_write (C++)
        tmp_path / ".step-00000008.x.tmp",
        tmp_path / ".zero_rank1.pt.q9w8e7.tmp",  # ZeroEngine.save_optimizer_checkpoint
    ]
    kept = [step_dir / "notes.tmp.txt", tmp_path / "tmp", step_dir / "manifest.json.tmp.pid"]
    for path in left + kept:
        path.write_text("partial")
    removed = ckpt.remove_temporary_files(tmp_path)
    assert sorted(removed) == sorted(left)
    assert all(p.exists() for p in kept) and not any(p.exists() for p in left)
    assert ckpt.verify(step_dir) is None


def test_safetensors_export_with_tied_weight(tmp_path):
    emb = torch.randn(16, 8)
    state = {
        "embed.weight": emb,
        "head.weight": emb,  # tied: same storage
        "block.0.bias": torch.randn(8),
        "block.0.qk": torch.randn(8, 4).t(),  # non-contiguous view
    }
    out = tmp_path / "export" / "model.safetensors"
    ckpt.export_safetensors(state, out)
    loaded = load_file(str(out))
    assert sorted(loaded) == sorted(state)
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), name
    assert not _leftover_temp_files(tmp_path)
    assert emb.data_ptr() == state["head.weight"].data_ptr()  # input left untouched


def test_sigterm_handler_sets_flag_and_restores(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    flag = ckpt.install_sigterm_handler()
    try:
        assert flag.requested is False
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5  # another thread may take the signal; wait for it
        while not flag.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert flag.requested is True and flag.signum == signal.SIGTERM
    finally:
        flag.close()
    assert signal.getsignal(signal.SIGTERM) == before
