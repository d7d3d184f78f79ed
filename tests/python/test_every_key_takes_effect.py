"""No configuration key may be accepted and silently ignored: every key of every schema the
project accepts (shardwise-train's pydantic models, the FSDP config keys, Accelerate's
``fsdp_config`` spellings, DeepSpeed's JSON keys), enumerated from the code, is in exactly one of
``key_effects``' tables: a test that asserts its effect, a documented no-op named in a warning,
or a gap with its reason. Nothing here runs the cited tests; they are found by parsing."""

from __future__ import annotations

import ast
import inspect
import re
import typing
import warnings
from dataclasses import fields
from pathlib import Path

import pytest
from key_effects import EFFECTS, GAPS, NO_OPS
from pydantic import AliasChoices, BaseModel
from shardwise.fsdp import config as fsdp_config
from shardwise.fsdp.config import ConfigError
from shardwise.train.config_schema import TrainConfig
from shardwise.zero import deepspeed_keys as K
from shardwise.zero.config import DeepSpeedConfigWarning, load

ROOT = Path(__file__).resolve().parents[2]
# shardwise-train fields typed as plain mappings whose keys are another schema's
ELSEWHERE = {"distributed.fsdp": "fsdp", "distributed.zero": "deepspeed"}
PROBE = "zz_not_a_key"


# --------------------------------------------------------------------------- the schemas


def _models(annotation) -> list[type[BaseModel]]:
    found = []
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and not typing.get_args(arg) and issubclass(arg, BaseModel):
            found.append(arg)
    return found


def _train_paths(model: type[BaseModel], prefix: str = ""):
    """Every leaf of the config as a dotted path, and every other name a field accepts."""
    for name, info in model.model_fields.items():
        path = prefix + name
        if path in ELSEWHERE:
            continue
        sections = _models(info.annotation)
        if sections:
            yield from _train_paths(sections[0], path + ".")
            continue
        yield path
        alias = info.validation_alias
        names = alias.choices if isinstance(alias, AliasChoices) else [alias]
        yield from (prefix + a for a in names if isinstance(a, str) and a != name)


def train_keys() -> set[str]:
    return {f"train:{p}" for p in _train_paths(TrainConfig)}


def fsdp_keys() -> set[str]:
    names = {f.name for f in fields(fsdp_config.FSDPConfig)} - {"extra"}
    return {f"fsdp:{k}" for k in names | fsdp_config.OTHER_DISTRIBUTED_KEYS}


def accelerate_keys() -> set[str]:
    """The tables' names plus the keys ``_from_accelerate`` reads by name (``key == "..."``)
    that are not FSDP keys themselves (fsdp_reshard_after_forward)."""
    tree = ast.parse(inspect.getsource(fsdp_config._from_accelerate))
    compared = {
        c.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Name)
        and node.left.id == "key"
        for c in node.comparators
        if isinstance(c, ast.Constant) and isinstance(c.value, str)
    }
    fsdp = {k.partition(":")[2] for k in fsdp_keys()}
    names = set(fsdp_config.ACCELERATE_KEYS) | fsdp_config.ACCELERATE_ACCEPTED
    return {f"accelerate:{k}" for k in names | (compared - fsdp)}


def _accepted(config: dict, section: str) -> set[str]:
    """The keys ``load`` accepts in ``section``, from its unknown-key error."""
    with pytest.raises(ConfigError) as info:
        load({"train_batch_size": 1, **config}, 1)
    text = str(info.value)
    assert text.startswith(f"{section}: unknown key '{PROBE}'"), text
    return set(text.rpartition("Valid keys: ")[2].split(", "))


def deepspeed_sections() -> dict[str, tuple[set, set]]:
    """Each section's (implemented keys, accepted-and-ignored keys); a key whose path is a
    section here is a block, not a leaf. optimizer and scheduler keep their keys in config.py,
    so ``load`` is asked for them."""
    return {
        "": (set(K.TOP), set(K.IGNORED_TOP)),
        "bf16": (set(K.BF16), set(K.IGNORED_BF16)),
        "fp16": (set(K.FP16), set(K.IGNORED_FP16)),
        "zero_optimization": (set(K.ZERO), set(K.IGNORED_ZERO)),
        "zero_optimization.offload_optimizer": (set(K.OFFLOAD_OPTIMIZER), set(K.IGNORED_OFFLOAD)),
        "zero_optimization.offload_param": (set(K.OFFLOAD_PARAM), set(K.IGNORED_OFFLOAD)),
        "optimizer": (_accepted({"optimizer": {PROBE: 1}}, "optimizer"), set()),
        "optimizer.params": (set(K.OPTIMIZER_PARAMS), set()),
        "scheduler": (_accepted({"scheduler": {PROBE: 1}}, "scheduler"), set()),
        "scheduler.params": (set(K.SCHEDULER_PARAMS), set()),
    }


def deepspeed_keys() -> set[str]:
    sections = deepspeed_sections()
    keys = set()
    for section, (valid, ignored) in sections.items():
        for key in valid | ignored:
            path = f"{section}.{key}" if section else key
            if path not in sections:
                keys.add(f"deepspeed:{path}")
    return keys


def every_key() -> set[str]:
    return train_keys() | fsdp_keys() | accelerate_keys() | deepspeed_keys()


TABLES = {"EFFECTS": EFFECTS, "NO_OPS": NO_OPS, "GAPS": GAPS}


# --------------------------------------------------------------------------- the tests


def test_the_enumeration_reaches_every_schema_and_its_nested_keys():
    """Catches a schema walker that silently finds nothing (or stops at the first level), which
    would make every test below pass vacuously; and a plain-mapping field that moved or was
    renamed, whose keys would then be counted nowhere."""
    keys = every_key()
    for known in (
        "train:training.micro_batch_size",
        "train:training.batch_size",  # an alias is a key too
        "train:training.checkpoint.every_steps",
        "train:training.profile.wait",
        "train:distributed.pipeline.schedule",
        "fsdp:fsdp_backward_prefetch",
        "fsdp:master_port",
        "accelerate:fsdp_offload_params",
        "accelerate:fsdp_reshard_after_forward",
        "deepspeed:zero_optimization.overlap_comm",
        "deepspeed:zero_optimization.offload_param.nvme_path",
        "deepspeed:optimizer.type",
        "deepspeed:scheduler.params.warmup_type",
    ):
        assert known in keys, known
    for block in ("distributed.fsdp", "distributed.zero", "training.profile"):
        assert f"train:{block}" not in keys, block
    for section in deepspeed_sections():
        assert f"deepspeed:{section}" not in keys, section
    fields = {n for m in _all_models(TrainConfig) for n in m.model_fields}
    for path in ELSEWHERE:
        assert path.rpartition(".")[2] in fields, f"{path} is no longer a field"
    assert all(len(group) > 5 for group in _by_schema(keys).values()), _by_schema(keys).keys()


def test_every_key_is_in_effects_no_ops_or_gaps():
    """Catches a key added to any schema (a new pydantic field, FSDPConfig field, Accelerate
    alias, DeepSpeed table entry) with no test of its effect, no warning naming it, and no
    gap recorded: the way a key gets accepted and silently ignored."""
    listed = set(EFFECTS) | set(NO_OPS) | set(GAPS)
    missing = sorted(every_key() - listed)
    assert not missing, (
        "keys with no effect test, no-op warning or recorded gap (add each to "
        f"tests/python/key_effects.py): {missing}"
    )


def test_no_table_entry_names_a_key_that_no_longer_exists():
    """Catches stale entries: a key renamed or removed from its schema while the tables still
    vouch for it (or a typo in an entry, which would leave the real key unaccounted for)."""
    keys = every_key()
    for name, table in TABLES.items():
        stale = sorted(set(table) - keys)
        assert not stale, f"{name} names keys no schema accepts: {stale}"


def test_the_tables_are_disjoint_and_every_entry_says_something():
    """Catches a key claimed as both tested and ignored (or tested and a gap), an EFFECTS
    entry with no test, an empty gap reason, and a no-op whose named table or function is not
    in the file it names."""
    for a, b in (("EFFECTS", "NO_OPS"), ("EFFECTS", "GAPS"), ("NO_OPS", "GAPS")):
        both = sorted(set(TABLES[a]) & set(TABLES[b]))
        assert not both, f"in both {a} and {b}: {both}"
    for key, tests in EFFECTS.items():
        assert isinstance(tests, tuple) and tests, key
        assert len(set(tests)) == len(tests), key
    for key, reason in GAPS.items():
        assert isinstance(reason, str) and len(reason) > 10, key
    for key, where in NO_OPS.items():
        path, _, rest = where.partition(" ")
        symbol = rest.split()[0]
        assert (ROOT / path).is_file(), (key, where)
        assert symbol in (ROOT / path).read_text(), (key, where)


def test_every_cited_test_exists():
    """Catches an EFFECTS entry (or a test a gap's reason points at) whose test was renamed or
    deleted: the key would be vouched for by nothing. Python tests are found by parsing the
    file for the function; C++ ones by their TEST(Suite, Name)."""
    cited = {t for tests in EFFECTS.values() for t in tests}
    for reason in GAPS.values():
        cited |= {m.group(0) for m in re.finditer(r"tests/[\w/.-]+\.(?:py|cc)::[\w.]+", reason)}
    assert len(cited) > 20, cited
    missing = sorted(t for t in cited if not _defines(*t.split("::")))
    assert not missing, f"cited tests that do not exist: {missing}"


# A value that makes each no-op appear in the warning; True for the rest.
TRIGGERS = {
    "zero_optimization.contiguous_gradients": False,
    "zero_optimization.reduce_scatter": False,
    "zero_optimization.allgather_partitions": False,
}


@pytest.mark.parametrize("key", sorted(k for k in NO_OPS if k.startswith("deepspeed:")))
def test_every_no_op_is_named_in_the_warning(key):
    """Catches a key listed as a documented no-op that the code accepts without naming it in
    DeepSpeedConfigWarning (so it is ignored silently after all), or that is no longer ignored
    (implemented now: move it to EFFECTS or GAPS)."""
    path = key.partition(":")[2]
    config: dict = {"train_batch_size": 1}
    node = config
    *sections, leaf = path.split(".")
    for section in sections:
        node = node.setdefault(section, {})
    node[leaf] = TRIGGERS.get(path, True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = load(config, 1)
    texts = [str(w.message) for w in caught if issubclass(w.category, DeepSpeedConfigWarning)]
    assert len(texts) == 1, (key, texts)
    assert f"{path} (" in texts[0] or f"{path}=" in texts[0], (key, texts[0])
    assert any(entry.startswith((f"{path} (", f"{path}=")) for entry in result["ignored"]), key


# --------------------------------------------------------------------------- helpers


def _all_models(model: type[BaseModel]) -> list[type[BaseModel]]:
    found = [model]
    for info in model.model_fields.values():
        for sub in _models(info.annotation):
            found += _all_models(sub)
    return found


def _by_schema(keys: set[str]) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for key in keys:
        groups.setdefault(key.partition(":")[0], set()).add(key)
    assert set(groups) == {"train", "fsdp", "accelerate", "deepspeed"}, set(groups)
    return groups


def _defines(path: str, name: str) -> bool:
    file = ROOT / path
    if not file.is_file():
        return False
    text = file.read_text()
    if file.suffix == ".cc":
        suite, _, test = name.partition(".")
        pattern = rf"\bTEST(?:_F|_P)?\(\s*{re.escape(suite)}\s*,\s*{re.escape(test)}\s*\)"
        return re.search(pattern, text) is not None
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
        for node in ast.walk(ast.parse(text))
    )
