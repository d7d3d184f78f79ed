"""Property-based fuzzing (hypothesis) of what users and files hand shardwise: YAML configs and
dotted overrides, DeepSpeed JSON configs, and checkpoint pieces. The property is the brief's
rule for bad input: it is either accepted or refused with a ValueError whose message names what
was wrong; any other exception (TypeError, KeyError, AttributeError, an assertion, a crash in C++)
is a bug. Each test runs a few hundred examples here; ``make fuzz`` runs the C++ targets longer.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shardwise.pieces import Slot, fill
from shardwise.train import config as train_config

FAST = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
ENV = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["fsdp", "ddp", "zero", "pipeline", "bf16", "full_shard", "1f1b", "auto"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
known = st.sampled_from(train_config._known_paths())


def nested(assignments: dict) -> dict:
    """{"a.b": 1} -> {"a": {"b": 1}}; a later path through a scalar replaces it."""
    root: dict = {}
    for path, value in assignments.items():
        node = root
        *parents, leaf = path.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = value
    return root


def accepted_or_value_error(call) -> None:
    try:
        call()
    except ValueError as error:
        assert str(error).strip(), "a refusal must say why"


@FAST
@given(st.dictionaries(known | st.text(min_size=1, max_size=10), values, max_size=6))
def test_any_config_mapping_is_accepted_or_refused_with_a_value_error(assignments):
    """Catches a config value of an unexpected type reaching code that assumes the right one (a
    TypeError or KeyError deep in the layout or mesh checks instead of a message naming the key)."""
    data = nested(assignments)
    accepted_or_value_error(lambda: train_config.validate(data, env=ENV, cuda_devices=0))


@FAST
@given(
    st.lists(
        st.tuples(known, st.text(max_size=16)).map(lambda kv: f"{kv[0]}={kv[1]}")
        | st.text(max_size=24),
        max_size=3,
    )
)
def test_any_dotted_override_is_accepted_or_refused_with_a_value_error(overrides):
    """Catches override text (unbalanced brackets, interpolations, a bare key) escaping as an
    OmegaConf or pydantic exception instead of the ValueError the CLI reports."""
    accepted_or_value_error(
        lambda: train_config.load_config(None, overrides, env=ENV, cuda_devices=0)
    )


@FAST
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "train_batch_size",
                "train_micro_batch_size_per_gpu",
                "gradient_accumulation_steps",
                "zero_optimization",
                "bf16",
                "fp16",
                "optimizer",
                "gradient_clipping",
                "scheduler",
            ]
        )
        | st.text(max_size=8),
        values,
        max_size=5,
    )
)
def test_any_deepspeed_json_is_accepted_or_refused_with_a_value_error(tmp_path_factory, ds):
    """Catches a hostile ds_config.json (wrong types, nested garbage) crashing the loader."""
    path = tmp_path_factory.mktemp("ds") / "ds_config.json"
    path.write_text(json.dumps(ds, allow_nan=True))
    data = {"distributed": {"strategy": "zero", "zero": str(path)}}
    accepted_or_value_error(lambda: train_config.validate(data, env=ENV, cuda_devices=0))


piece = st.tuples(
    st.sampled_from(["w", "b", "x"]),
    st.integers(min_value=-(2**62), max_value=2**62) | st.integers(min_value=-4, max_value=12),
    st.integers(min_value=0, max_value=6),
)


@FAST
@given(st.lists(piece, max_size=6), st.integers(min_value=0, max_value=4), st.integers(0, 8))
def test_hostile_checkpoint_pieces_fill_exactly_or_are_refused(pieces, start, length):
    """Catches pieces whose ranges overlap, overflow or leave gaps being taken as covering a slot
    (overlaps used to count twice, so a duplicated piece hid a missing one) and out-of-range
    starts reaching the copy. Accepted: every element equals the one piece-defined value."""
    given_pieces = [
        {"name": name, "start": p_start, "values": torch.arange(n, dtype=torch.float32) + p_start}
        for name, p_start, n in pieces
    ]
    slot = torch.full((length,), -1.0)
    try:
        fill([Slot("w", start, slot)], given_pieces, strict=True)
    except ValueError as error:
        assert "'w'" in str(error) or "piece" in str(error), str(error)
        return
    # Every piece holds element e = e (values arange + start), so an accepted fill is exact.
    assert torch.equal(slot, torch.arange(start, start + length, dtype=torch.float32))


@pytest.mark.parametrize(
    "pieces, reason",
    [
        ([("w", 0, 2), ("w", 0, 2)], "cover only 2 of the 4"),  # duplicated, not a gap-filler
        ([("w", -3, 2)], "start -3"),
        ([("w", 2**62, 2**3)], "cover only 0 of the 4"),
    ],
)
def test_hostile_pieces_are_named(pieces, reason):
    """The regression cases of the property above, with the words users see."""
    given_pieces = [{"name": n, "start": s, "values": torch.zeros(min(k, 8))} for n, s, k in pieces]
    with pytest.raises(ValueError, match=reason):
        fill([Slot("w", 0, torch.zeros(4))], given_pieces, strict=True)
