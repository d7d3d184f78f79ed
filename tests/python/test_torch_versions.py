"""The supported torch range, said once and checked at import: pyproject.toml and CMakeLists.txt
name the same oldest torch, the installed CMake package records it with the torch the library was
built against, and importing shardwise with a torch of another minor version (LibTorch's ABI
changes between them) is an ImportError naming both versions and the fix, before the native
library loads (it would fail with an undefined symbol, or worse, run)."""

import re
import subprocess
import sys
from pathlib import Path

import shardwise
import tomllib
import torch
from shardwise import _torch_versions

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(shardwise.__file__).resolve().parent


def _cmake_minimum() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"^set\(SHARDWISE_MIN_TORCH_VERSION ([0-9.]+)\)", text, re.M).group(1)


def test_pyproject_and_cmake_name_the_same_oldest_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = f"torch>={_cmake_minimum()}"
    assert wanted in project["build-system"]["requires"]
    assert wanted in project["project"]["dependencies"]


def test_the_installed_package_records_the_range_and_the_build():
    config = PACKAGE / _torch_versions.CONFIG
    assert _torch_versions.recorded(config, "MIN_TORCH_VERSION") == _cmake_minimum()
    built = _torch_versions.recorded(config, "TORCH_VERSION")
    assert built is not None and _torch_versions.minor(built) == _torch_versions.minor(
        torch.__version__
    )


def _fake_package(tmp_path: Path, built: str, oldest: str) -> Path:
    config = tmp_path / _torch_versions.CONFIG
    config.parent.mkdir(parents=True)
    config.write_text(
        f'set(shardwise_TORCH_VERSION "{built}")\nset(shardwise_MIN_TORCH_VERSION "{oldest}")\n'
    )
    return tmp_path


def test_a_torch_of_the_built_minor_version_is_accepted(tmp_path):
    package = _fake_package(tmp_path, "2.13.0", "2.11")
    assert _torch_versions.mismatch(package, "2.13.1+cpu") is None


def test_another_minor_version_names_both_and_the_fix(tmp_path):
    package = _fake_package(tmp_path, "2.13.0", "2.11")
    text = _torch_versions.mismatch(package, "2.14.1+cu130")
    assert "built against torch 2.13.0" in text and "imported torch 2.14.1+cu130" in text
    assert "pip install --no-build-isolation --force-reinstall shardwise" in text


def test_a_torch_older_than_the_range_is_refused_first(tmp_path):
    package = _fake_package(tmp_path, "2.10.0", "2.11")
    text = _torch_versions.mismatch(package, "2.10.0")
    assert text.startswith("shardwise supports torch 2.11 and newer"), text


def test_import_refuses_another_torch_before_loading_the_library():
    code = (
        "import sys, torch; torch.__version__ = '1.99.0'; "
        "import shardwise"  # must fail in shardwise/__init__.py, before shardwise._C loads
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "ImportError: shardwise supports torch" in proc.stderr, proc.stderr[-2000:]
    assert "imported torch 1.99.0" in proc.stderr, proc.stderr[-2000:]
