"""Tests of ``shardwise.train.data``: the bundled corpus, the byte tokenizer and the sharded,
resumable token stream."""

import pytest
import torch
from shardwise.train import data


def test_corpus_is_real_english_text():
    text = data.load_corpus()
    assert len(text.encode("utf-8")) > 400_000
    for word in (" the ", " and ", " function ", " which ", " is "):
        assert text.count(word) > 100, word
    assert text == data.load_corpus()  # deterministic


def test_tokenizer_round_trip_and_vocab():
    tok = data.ByteTokenizer()
    text = "naïve café — ünïcode ✓ and plain ASCII\n"
    ids = tok.encode(text)
    assert ids.dtype == torch.long and int(ids.min()) >= 0 and int(ids.max()) < tok.vocab_size
    assert len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode(ids.tolist()) == text
    assert tok.decode([0xFF, 0x41]) == "\ufffdA"  # invalid UTF-8 is replaced, not raised
    assert tok.decode(tok.encode("")) == ""


def test_split_keeps_last_five_percent_for_validation():
    train, val = data.corpus_splits()
    tokens = data.ByteTokenizer().encode(data.load_corpus())
    assert len(train) + len(val) == len(tokens)
    assert abs(len(val) / len(tokens) - 0.05) < 1e-3
    assert torch.equal(val.long(), tokens[-len(val) :])
    assert torch.equal(train.long(), tokens[: len(train)])


def test_targets_are_inputs_shifted_by_one():
    tokens = torch.arange(1000) % 256
    stream = data.TokenStream(tokens, seq_len=16, micro_batch=4, data_rank=1, data_world=2)
    inputs, targets = next(stream)
    assert inputs.shape == targets.shape == (4, 16)
    assert inputs.dtype == targets.dtype == torch.long
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert torch.equal(targets, (inputs + 1) % 256)  # arange data: next token = token + 1


def _epoch_windows(stream):
    return [stream.batch_windows(0, i).tolist() for i in range(stream.batches_per_epoch)]


def test_data_ranks_read_disjoint_shards_covering_the_epoch():
    tokens = torch.arange(12 * 8 + 1) % 256  # 12 windows of 8 tokens
    world = 3
    streams = [data.TokenStream(tokens, 8, 2, r, world, seed=5) for r in range(world)]
    assert all(s.batches_per_epoch == 2 for s in streams)
    per_rank = [sorted(w for b in _epoch_windows(s) for w in b) for s in streams]
    for a in range(world):
        for b in range(a + 1, world):
            assert not set(per_rank[a]) & set(per_rank[b])
    assert sorted(sum(per_rank, [])) == list(range(12))
    # the actual batches of different ranks differ too
    assert not torch.equal(next(streams[0])[0], next(streams[1])[0])


def test_stream_is_deterministic_and_reshuffles_per_epoch():
    train, _ = data.corpus_splits()
    a = data.TokenStream(train, 64, 4, 0, 2, seed=1)
    b = data.TokenStream(train, 64, 4, 0, 2, seed=1)
    c = data.TokenStream(train, 64, 4, 0, 2, seed=2)
    x = next(a)[0]
    assert torch.equal(x, next(b)[0])
    assert not torch.equal(x, next(c)[0])
    assert not torch.equal(a.window_order(0), a.window_order(1))
    # same data rank (e.g. two pipeline stages of one replica) -> same batches
    stage2 = data.TokenStream(train, 64, 4, 0, 2, seed=1)
    assert torch.equal(x, next(stage2)[0])


def test_state_resumes_with_identical_next_batch_across_epochs():
    tokens = torch.randint(0, 256, (10 * 8 + 1,))
    stream = data.TokenStream(tokens, 8, 2, 1, 2, seed=3)  # 2 batches per epoch
    for _ in range(3):
        next(stream)
    state = stream.state()
    assert state == {"epoch": 1, "index": 1}
    expected = [next(stream) for _ in range(3)]
    resumed = data.TokenStream(tokens, 8, 2, 1, 2, seed=3)
    resumed.load_state(state)
    for want, got in zip(expected, (next(resumed) for _ in range(3)), strict=True):
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    with pytest.raises(ValueError):
        resumed.load_state({"epoch": 0, "index": 2})


def test_too_little_data_is_rejected():
    with pytest.raises(ValueError, match="global batch"):
        data.TokenStream(torch.zeros(20, dtype=torch.long), 8, 2, 0, 2)


def _reference_batch(tokens, seq_len, micro_batch, rank, world, seed, epoch, index):
    """The stream's rule written out in torch (the module docstring), to pin the C++ stream."""
    windows = (len(tokens) - 1) // seq_len
    gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2**63))
    order = torch.randperm(windows, generator=gen)
    per_global = micro_batch * world
    starts = order[index * per_global : (index + 1) * per_global][rank::world] * seq_len
    rows = tokens[starts[:, None] + torch.arange(seq_len + 1)[None, :]].long()
    return rows[:, :-1], rows[:, 1:]


def test_stream_batches_follow_the_documented_rule_exactly():
    """Catches: the C++ stream (which the C++ trainer reads too) drifting from the documented
    shuffle, e.g. another generator seed, another permutation or another per-rank slice."""
    tokens = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(3))
    tokens = tokens.to(torch.uint8)
    for seed in (0, 7, 2**62 + 5):
        for rank, world in ((0, 1), (1, 2), (2, 3)):
            stream = data.TokenStream(
                tokens, seq_len=16, micro_batch=4, data_rank=rank, data_world=world, seed=seed
            )
            for epoch, index in ((0, 0), (0, 3), (2, 1)):
                got = stream.batch(epoch, index)
                want = _reference_batch(tokens, 16, 4, rank, world, seed, epoch, index)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
                assert got[0].dtype == torch.long
