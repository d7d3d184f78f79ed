"""The C++ package as its users meet it: ``examples/cpp/train_gpt`` configured out of tree with
nothing but ``find_package(shardwise)`` against an installed shardwise, built, and run under
``torchrun --no-python``.

Installations tested (``make test-package`` runs this file once per torch):
    ``pip``            pip's copy, found through ``shardwise.cmake_prefix_path``;
    ``cmake-install``  ``cmake --install``'s prefix, when ``SHARDWISE_INSTALL_PREFIX`` names it.
``SHARDWISE_OTHER_TORCH`` (a torch of another minor version's ``cmake_prefix_path``) enables the
mismatch test. No conftest: this folder must not need ``import shardwise`` to be collected.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cpp" / "train_gpt"
BUILD = ROOT / "build" / "package-tests"
TORCHRUN = Path(sys.executable).with_name("torchrun")
# A small GPT; the 2-process run reads 4 windows per rank, the 1-process run 8: one global batch.
MODEL = ["--dim", "64", "--layers", "2", "--heads", "4", "--seq-len", "64", "--steps", "12"]
MODEL += ["--log-every", "3", "--threads", "1"]


def _pip_prefix() -> str:
    code = "import shardwise; print(shardwise.cmake_prefix_path)"
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


def _installations() -> list:
    found = [pytest.param("pip", id="pip")]
    if os.environ.get("SHARDWISE_INSTALL_PREFIX"):
        found.append(pytest.param("cmake-install", id="cmake-install"))
    return found


def _prefix(kind: str) -> str:
    return _pip_prefix() if kind == "pip" else os.environ["SHARDWISE_INSTALL_PREFIX"]


def _configure(build: Path, prefixes: list[str]) -> subprocess.CompletedProcess:
    # A cache would keep the torch and shardwise found last time.
    (build / "CMakeCache.txt").unlink(missing_ok=True)
    command = ["cmake", "-S", str(EXAMPLE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"]
    command.append("-DCMAKE_PREFIX_PATH=" + ";".join(prefixes))
    if shutil.which("ninja"):
        command += ["-G", "Ninja"]
    command += _cuda_toolkit()
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def _cuda_toolkit() -> list[str]:
    """Where the CUDA toolkit is, for a CUDA torch's CMake config (which needs it to be found
    even by CPU-only consumers); nothing without one."""
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    if not (home / "bin" / "nvcc").exists():
        return []
    return [f"-DCUDA_TOOLKIT_ROOT_DIR={home}", f"-DCMAKE_CUDA_COMPILER={home / 'bin' / 'nvcc'}"]


def _build_train_gpt(kind: str) -> Path:
    """The example built against one installation (a lasting folder per installation and torch,
    so ccache and ninja make a rebuild cheap)."""
    build = BUILD / f"{kind}-torch{torch.__version__}"
    configured = _configure(build, [torch.utils.cmake_prefix_path, _prefix(kind)])
    assert configured.returncode == 0, configured.stdout + configured.stderr
    built = subprocess.run(
        ["cmake", "--build", str(build)], capture_output=True, text=True, timeout=900
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return build / "train_gpt"


@pytest.fixture(scope="module", params=_installations())
def train_gpt(request) -> Path:
    return _build_train_gpt(request.param)


@pytest.fixture(scope="module")
def pip_train_gpt() -> Path:
    """The example against pip's installation only, for tests whose subject does not depend on
    how shardwise was installed."""
    return _build_train_gpt("pip")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The bundled corpus (CPython's help topics) as the text file the C++ trainer reads."""
    from pydoc_data.topics import topics

    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    text = "\n\n".join(topics[key].strip("\n") for key in sorted(topics)) + "\n"
    path.write_bytes(text.encode("utf-8"))
    return path


def _losses(output: str) -> list[float]:
    return [float(m) for m in re.findall(r"^step \d+ loss (\S+)", output, re.MULTILINE)]


def _run(command: list[str]) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """A float32 safetensors file read with the stdlib and torch (this venv may lack the
    safetensors package; tests/python/test_safetensors.py reads files with it)."""
    data = path.read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + length])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", entry
        begin, end = (8 + length + offset for offset in entry["data_offsets"])
        values = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        out[name] = values.reshape(entry["shape"])
    return out


def _python_gpt_loads(state: dict[str, torch.Tensor]) -> None:
    """The Python trainer's GPT (python/shardwise/models/gpt.py) takes the C++ export whole."""
    from shardwise.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=256, seq_len=64, dim=64, layers=2, heads=4))
    model.load_state_dict(state, strict=True)  # every name, every shape, nothing extra
    assert torch.equal(model.head.weight, state["embed.weight"])


@pytest.mark.parametrize("strategy", ["fsdp", "zero2"])
def test_two_processes_under_torchrun_match_one_process(train_gpt, corpus, strategy, tmp_path):
    """Catches: a package whose library or config cannot be consumed out of tree (missing
    headers, torch not re-found, registrations dropped at link time), a process group from
    torchrun's environment that does not form (the agent's store), and FSDP or ZeRO-2 from C++
    that does not train like one process on the same global batch."""
    common = ["--data", str(corpus), "--strategy", strategy, *MODEL]
    single = _losses(_run([str(train_gpt), "--micro-batch", "8", *common]))
    launch = [str(TORCHRUN), "--no-python", "--standalone", "--nproc_per_node=2"]
    saved = tmp_path / "model.safetensors"
    output = _run([*launch, str(train_gpt), "--micro-batch", "4", *common, "--save", str(saved)])
    double = _losses(output)
    assert len(single) == len(double) == 4, output
    assert double == pytest.approx(single, abs=1e-5)
    assert double[-1] < double[0] - 0.3, f"the loss did not fall: {double}"
    summary = r"^summary world 2 tokens/s [0-9.]+ step_s [0-9.]+ peak_rss_mib [0-9.]+$"
    assert re.search(summary, output, re.MULTILINE), output
    _python_gpt_loads(_read_safetensors(saved))


@pytest.mark.parametrize(
    ("layout", "processes"),
    [
        (["--pp", "2"], 2),
        (["--pp", "2", "--schedule", "gpipe"], 2),
        (["--tp", "2"], 2),
        (["--pp", "2", "--tp", "2"], 4),
    ],
    ids=["pp2-1f1b", "pp2-gpipe", "tp2", "pp2-tp2"],
)
def test_pipeline_and_tensor_parallel_runs_match_one_process(
    train_gpt, corpus, layout, processes, tmp_path
):
    """Catches: a C++ pipeline or tensor-parallel GPT that does not train like the whole model
    on the same batch (a tied embedding/head whose copies drift, microbatches scaled twice or not
    at all, a shard cut from the wrong rows, clipping on one rank's part of the norm, a stage's
    tp shards or the tie's shard counted twice in it), and an export that misses or
    mis-assembles another rank's parameters."""
    common = ["--data", str(corpus), "--micro-batch", "8", *MODEL]
    one = tmp_path / "one.safetensors"
    single = _losses(_run([str(train_gpt), *common, "--save", str(one)]))
    launch = [str(TORCHRUN), "--no-python", "--standalone", f"--nproc_per_node={processes}"]
    saved = tmp_path / "split.safetensors"
    output = _run([*launch, str(train_gpt), *common, *layout, "--save", str(saved)])
    double = _losses(output)
    assert len(single) == len(double) == 4, output
    assert double == pytest.approx(single, abs=1e-5)
    assert double[-1] < double[0] - 0.3, f"the loss did not fall: {double}"
    state, reference = _read_safetensors(saved), _read_safetensors(one)
    assert sorted(state) == sorted(reference)
    for name, value in reference.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=1e-4, msg=name)
    _python_gpt_loads(state)


@pytest.mark.parametrize(
    ("layout", "processes"),
    [
        (["--micro-batch", "2", "--accumulation", "2"], 2),
        (["--micro-batch", "2", "--strategy", "zero2"], 4),
        (["--micro-batch", "8", "--pp", "2", "--microbatches", "4"], 2),
        (["--micro-batch", "4", "--pp", "2", "--microbatches", "2"], 4),
    ],
    ids=["fsdp-dp2", "zero2-dp4", "pp2", "pp2-dp2"],
)
def test_deterministic_runs_give_the_bits_of_one_process(
    pip_train_gpt, corpus, layout, processes, tmp_path
):
    """--deterministic: a global batch of 4 micro-batches of 2 rows, as FSDP on one process
    (accumulation 4) and split over data ranks or pipeline stages: every exported tensor and every
    logged loss is the same bits. Catches C++ engines whose deterministic option is not passed
    (FSDP, ZeRO, the pipeline), a strided data split, a loss divided by the local count, and a
    logged loss averaged in rank order."""
    model = [*MODEL[:-2], "--deterministic"]  # one intra-op thread: the mode sets it
    common = ["--data", str(corpus), *model]
    one = tmp_path / "one.safetensors"
    single = _run([str(pip_train_gpt), *common, "--micro-batch", "2", "--accumulation", "4",
                   "--save", str(one)])  # fmt: skip
    launch = [str(TORCHRUN), "--no-python", "--standalone", f"--nproc_per_node={processes}"]
    split = tmp_path / "split.safetensors"
    output = _run([*launch, str(pip_train_gpt), *common, *layout, "--save", str(split)])
    assert _losses(output) == _losses(single) and len(_losses(single)) == 4, output
    state, reference = _read_safetensors(split), _read_safetensors(one)
    assert sorted(state) == sorted(reference)
    for name, value in reference.items():
        assert torch.equal(state[name].view(torch.int32), value.view(torch.int32)), name


def _python_trainer(out_dir: Path, steps: int, strategy: str) -> dict[int, float]:
    """shardwise-train at world 2 on the C++ trainer's model and schedule (FSDP or ZeRO-2, fp32,
    AdamW at lr 1e-3 with cosine decay, clip 1.0), checkpointing every 3 steps into
    out_dir/checkpoints and resuming from the newest there; returns its loss per step."""
    distributed = {"strategy": "fsdp", "backend": "shardwise"}
    if strategy == "zero2":
        distributed = {"strategy": "zero", "backend": "shardwise"}
        distributed["zero"] = {"zero_optimization": {"stage": 2}}
    config = {
        "model": {"preset": "tiny", "dim": 64, "layers": 2, "heads": 4, "seq_len": 64},
        "training": {
            "micro_batch_size": 4,
            "learning_rate": 1e-3,
            "warmup_steps": 0,
            "max_steps": steps,
            "mixed_precision": "no",
            "gradient_clip_norm": 1.0,
            "log_every": 1,
            "checkpoint": {"dir": str(out_dir), "every_steps": 3},
        },
        "distributed": distributed,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config))
    launch = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "shardwise.train"]
    _run([*launch, "--config", str(out_dir / "config.json")])
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.fixture(scope="module")
def python_run(tmp_path_factory):
    """shardwise-train's 6-step run of a strategy (checkpoints at steps 3 and 6, losses per
    step), made once per strategy and shared by the layouts that resume it."""
    runs: dict[str, tuple[Path, dict[int, float]]] = {}

    def run(strategy: str) -> tuple[Path, dict[int, float]]:
        if strategy not in runs:
            out_dir = tmp_path_factory.mktemp(f"python-{strategy}")
            runs[strategy] = (out_dir / "checkpoints", _python_trainer(out_dir, 6, strategy))
        return runs[strategy]

    return run


# The C++ layout: its flags (8 rows per step in all, as shardwise-train's 2 ranks of 4), its
# processes and the shardwise-train strategy whose checkpoints it shares. Pieces are layout-free,
# so a pipeline's or tensor-parallel run's checkpoint resumes in FSDP and the reverse; ZeRO
# resumes ZeRO.
RESUME_LAYOUTS = {
    "fsdp": (["--strategy", "fsdp", "--micro-batch", "4"], 2, "fsdp"),
    "zero2": (["--strategy", "zero2", "--micro-batch", "4"], 2, "zero2"),
    "pp2": (["--pp", "2", "--micro-batch", "8"], 2, "fsdp"),
    "tp2": (["--tp", "2", "--micro-batch", "8"], 2, "fsdp"),
    "pp2-tp2": (["--pp", "2", "--tp", "2", "--micro-batch", "8"], 4, "fsdp"),
}


@pytest.mark.parametrize("layout", sorted(RESUME_LAYOUTS))
def test_checkpoints_resume_across_the_cpp_and_python_trainers(
    pip_train_gpt, corpus, layout, python_run, tmp_path
):
    """Catches: a C++ checkpoint that shardwise-train cannot load (pickle, manifest, piece names
    or ZeRO's parameter indices, AdamW moments or step count, data position) or the reverse;
    pieces that do not refill shards at another world size or layout (a tensor-parallel shard's
    runs placed wrong, a pipeline stage's tied head copy written twice or never refilled, a
    replica missing from or duplicated in the pieces): each resumed run must go on exactly as the
    run that saved."""
    for module in ("omegaconf", "pydantic"):  # the CPU venv installs shardwise with --no-deps
        pytest.importorskip(module, reason="shardwise-train's dependencies are not installed here")
    layout_flags, processes, strategy = RESUME_LAYOUTS[layout]
    flags = ["--data", str(corpus), *MODEL[:8], "--steps", "6", "--log-every", "1"]
    flags += ["--threads", "1", "--save-every", "3"]
    launch = [str(TORCHRUN), "--no-python", "--standalone", f"--nproc_per_node={processes}"]
    # C++ saves steps 3 and 6; without step 6, shardwise-train resumes from 3.
    cpp_dir = tmp_path / "from-cpp"
    checkpoints = cpp_dir / "checkpoints"
    output = _run(
        [*launch, str(pip_train_gpt), *flags, *layout_flags, "--checkpoint-dir", str(checkpoints)]
    )
    cpp = dict(enumerate(_losses(output), start=1))
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000003", "step-00000006"]
    shutil.rmtree(checkpoints / "step-00000006")
    resumed = _python_trainer(cpp_dir, 6, strategy)
    assert sorted(resumed) == [4, 5, 6], resumed
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(cpp[step], abs=1e-5), (step, resumed, cpp)
    # shardwise-train saved steps 3 and 6; C++ resumes from 3: FSDP and ZeRO as one process of 8
    # rows (another world size), the pipeline and tensor-parallel layouts as they saved.
    saved, python = python_run(strategy)
    py_checkpoints = tmp_path / "from-python" / "checkpoints"
    shutil.copytree(saved, py_checkpoints)
    shutil.rmtree(py_checkpoints / "step-00000006")
    command = [str(pip_train_gpt), *flags, "--checkpoint-dir", str(py_checkpoints)]
    if layout in ("fsdp", "zero2"):
        command += ["--strategy", layout, "--micro-batch", "8"]
    else:
        command = [*launch, *command, *layout_flags]
    output = _run(command)
    assert "resumed from" in output and "(step 3, saved by 2 ranks)" in output, output
    cpp = dict(zip((4, 5, 6), _losses(output), strict=True))
    for step in (4, 5, 6):
        assert cpp[step] == pytest.approx(python[step], abs=1e-5), (step, cpp, python)


def test_asynchronous_checkpoints_hold_what_synchronous_ones_do(pip_train_gpt, corpus, tmp_path):
    """--checkpoint-mode async (training::AsyncRunCheckpoints: a background writer over a group
    of its own): the same losses and step folders as synchronous saves, every one intact, each
    rank's payload equal to the synchronous run's. Catches a state copied after training went
    on (the live parameters and moments changed under the writer), a manifest written before a
    rank's file, or a last save the run did not wait for."""
    flags = ["--data", str(corpus), *MODEL[:8], "--steps", "6", "--log-every", "1"]
    flags += ["--threads", "1", "--save-every", "2", "--strategy", "fsdp", "--micro-batch", "4"]
    launch = [str(TORCHRUN), "--no-python", "--standalone", "--nproc_per_node=2"]
    runs = {}
    for mode in ("sync", "async"):
        folder = tmp_path / mode
        output = _run([*launch, str(pip_train_gpt), *flags, "--checkpoint-dir", str(folder),
                       "--checkpoint-mode", mode])  # fmt: skip
        runs[mode] = (folder, _losses(output))
    (sync_dir, sync_losses), (async_dir, async_losses) = runs["sync"], runs["async"]
    assert async_losses == sync_losses
    names = sorted(p.name for p in async_dir.iterdir())
    saved = ["step-00000002", "step-00000004", "step-00000006"]
    assert names == sorted(p.name for p in sync_dir.iterdir()) == saved
    from shardwise.train import checkpoint

    for name in names:
        assert checkpoint.verify(async_dir / name) is None
        for rank in (0, 1):
            ours = checkpoint.load(async_dir / name, rank)
            theirs = checkpoint.load(sync_dir / name, rank)
            assert ours["step"] == theirs["step"] and ours["data"] == theirs["data"]
            assert torch.equal(ours["rng"], theirs["rng"])
            pairs = zip(ours["pieces"], theirs["pieces"], strict=True)
            assert all(a["name"] == b["name"] and torch.equal(a["values"], b["values"])
                       for a, b in pairs)  # fmt: skip


def test_bad_flags_are_named_before_anything_runs(train_gpt, corpus):
    """Catches: bad input that starts a run (or crashes) instead of naming the argument."""
    for flags, message in [
        (["--steps", "x"], "--steps x: not a number"),
        (["--dtype", "fp8"], "--dtype fp8: use fp32 or bf16"),
        (["--bogus", "1"], "unknown flag --bogus"),
        (["--strategy", "pp"], "--strategy pp: use fsdp, zero1 or zero2"),
        (["--pp", "2", "--strategy", "zero2"], "--strategy zero2 with --pp or --tp"),
        (["--tp", "5"], "--tp 5 must divide --dim (192)"),
        (["--tp", "3"], "--tp 3 must divide the vocabulary size (256)"),
        (["--tp", "2"], "2 × 1 = 2 > WORLD_SIZE=1; lower --tp or --pp, or launch more"),
        (["--tp", "2", "--pp", "2"], "2 × 2 = 4 > WORLD_SIZE=1; lower --tp or --pp"),
        (["--warmup-steps", "20", "--steps", "10"], "--warmup-steps 20 exceeds --steps 10"),
        (["--pp", "2", "--microbatches", "3"], "must be a multiple of --microbatches 3"),
        (["--pp", "2"], "1 × 2 = 2 > WORLD_SIZE=1"),
        (["--schedule", "zb"], "--schedule zb: use 1f1b or gpipe"),
        (["--pp", "2", "--accumulation", "2"], "--accumulation with --pp"),
        (["--deterministic", "--tp", "2"], "--deterministic with --tp"),
        (["--deterministic", "--threads", "2"], "--deterministic runs one intra-op thread"),
        ([], "--data is required"),
    ]:
        data = ["--data", str(corpus)] if flags or message != "--data is required" else []
        done = subprocess.run([str(train_gpt), *data, *flags], capture_output=True, text=True)
        assert done.returncode == 2 and message in done.stderr, done.stderr


@pytest.mark.skipif(
    not os.environ.get("SHARDWISE_OTHER_TORCH"), reason="SHARDWISE_OTHER_TORCH is not set"
)
def test_a_torch_of_another_minor_version_is_refused_by_name():
    """Catches: a consumer silently linking shardwise against a LibTorch of another ABI (a crash
    at run time) instead of find_package(shardwise) saying what to do."""
    build = BUILD / f"mismatch-torch{torch.__version__}"
    other = os.environ["SHARDWISE_OTHER_TORCH"]
    configured = _configure(build, [other, _pip_prefix()])
    log = " ".join((configured.stdout + configured.stderr).split())  # CMake wraps messages
    assert configured.returncode != 0, log
    built_against = re.match(r"\d+\.\d+", torch.__version__).group(0)
    assert f"was built against LibTorch {built_against}" in log, log
    assert "LibTorch's ABI changes between minor versions" in log, log


def _mesh_lines(output: str) -> list[str]:
    """The mesh a trainer printed: its "mesh: ..." line and the axes' groups below it."""
    lines = output.splitlines()
    start = next((k for k, line in enumerate(lines) if line.startswith("mesh: ")), None)
    assert start is not None, output
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not re.match(r"  [a-z]+ groups:", line):
            break
        block.append(line)
    return block


@pytest.mark.parametrize(
    "world, mesh, flags, pipelines",
    [
        (4, [[2, 2], ["dp", "pp"]], ["--pp", "2"], "  pp groups: [0, 2] [1, 3]"),
        pytest.param(
            8,
            [[2, 2, 2], ["dp", "pp", "tp"]],
            ["--pp", "2", "--tp", "2"],
            "  pp groups: [0, 4] [1, 5] [2, 6] [3, 7]",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["world4-dp-pp", "world8-dp-pp-tp"],
)
def test_both_trainers_place_the_ranks_alike(
    pip_train_gpt, corpus, tmp_path, world, mesh, flags, pipelines
):
    """Catches the C++ trainer and shardwise-train laying one mesh out differently (which ranks
    form a pipeline or a tensor-parallel group decides which traffic crosses the slow links):
    at world 4 (dp × pp) and world 8 (dp × pp × tp, ``make test-package-slow``) both print the
    same mesh, pp outermost and tp innermost as the C++ MeshLayout has it."""
    for module in ("omegaconf", "pydantic"):  # the CPU venv installs shardwise with --no-deps
        pytest.importorskip(module, reason="shardwise-train's dependencies are not installed here")
    launch = [str(TORCHRUN), "--standalone", f"--nproc_per_node={world}"]
    common = ["--data", str(corpus), *MODEL[:8], "--steps", "1", "--threads", "1"]
    cpp = _run([*launch, "--no-python", str(pip_train_gpt), *common, *flags])
    config = tmp_path / "mesh.json"
    config.write_text(
        json.dumps(
            {
                "model": {"preset": "tiny", "mesh_shape": mesh},
                "training": {
                    "max_steps": 1,
                    "warmup_steps": 0,
                    "checkpoint": {"dir": str(tmp_path / "run")},
                },
                "distributed": {"backend": "shardwise", "pipeline": {"num_microbatches": 2}},
            }
        )
    )
    python = _run([*launch, "-m", "shardwise.train", "--config", str(config)])
    assert _mesh_lines(cpp) == _mesh_lines(python), (cpp, python)
    assert pipelines in _mesh_lines(python), python
