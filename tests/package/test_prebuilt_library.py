"""setup.py with ``SHARDWISE_LIBRARY_PREFIX``: the Python module built against a libshardwise that
``cmake --install`` put in a prefix, instead of building the library again (``make test-gpu``
uses it to build the library on one machine and only the module on a GPU machine).

Catches: a folder that is no installation, or an installation built against another torch minor
version, accepted by setup.py and failing only at import or at the first call; the module not
finding the copied library (its RPATH is ``$ORIGIN/lib``). The positive test needs
``SHARDWISE_INSTALL_PREFIX`` (``make test-package`` sets it to ``make test-cpp``'s installation,
built against the CPU torch) and a torch of that minor version.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _build_ext(out: Path, prefix: Path) -> subprocess.CompletedProcess:
    """setup.py build_ext into `out` (not the source tree) against the library at `prefix`; the
    objects in setup.py's lasting folder of the clone, which the installs share (a --build-temp
    outside the clone would compile the module again on every run, missing the compiler cache)."""
    env = dict(os.environ, SHARDWISE_LIBRARY_PREFIX=str(prefix))
    command = [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(out / "lib")]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)


def _torch_minor() -> str:
    return ".".join(torch.__version__.split(".")[:2])


def test_a_folder_that_is_no_installation_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    done = _build_ext(tmp_path, tmp_path / "empty")
    assert done.returncode != 0
    assert "SHARDWISE_LIBRARY_PREFIX=" in done.stderr, done.stderr[-2000:]
    assert "is not a cmake --install prefix of shardwise" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "temp").exists(), "compiled before refusing"


def test_an_installation_for_another_torch_is_refused(tmp_path):
    prefix = tmp_path / "other"
    (prefix / "lib").mkdir(parents=True)
    (prefix / "lib" / "libshardwise.so").write_bytes(b"")
    config = prefix / "share" / "cmake" / "shardwise" / "shardwiseConfig.cmake"
    config.parent.mkdir(parents=True)
    config.write_text('set(shardwise_TORCH_VERSION "1.0.2")\n')
    done = _build_ext(tmp_path, prefix)
    assert done.returncode != 0
    expected = f"was built against torch 1.0.2, but this process imported torch {torch.__version__}"
    assert expected in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "temp").exists(), "compiled before refusing"


def _installed_torch_minor(prefix: Path) -> str | None:
    config = prefix / "share" / "cmake" / "shardwise" / "shardwiseConfig.cmake"
    if not config.is_file():
        return None
    match = re.search(r'set\(shardwise_TORCH_VERSION "([0-9]+\.[0-9]+)', config.read_text())
    return match.group(1) if match else None


@pytest.mark.skipif(
    not os.environ.get("SHARDWISE_INSTALL_PREFIX")
    or _installed_torch_minor(Path(os.environ["SHARDWISE_INSTALL_PREFIX"])) != _torch_minor(),
    reason="needs SHARDWISE_INSTALL_PREFIX built against this torch (make test-package sets it)",
)
def test_the_module_builds_against_an_installed_library_and_runs(tmp_path):
    done = _build_ext(tmp_path, Path(os.environ["SHARDWISE_INSTALL_PREFIX"]))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    # The package as an installation would hold it: the Python files, the module, the library.
    package = tmp_path / "site" / "shardwise"
    shutil.copytree(
        ROOT / "python" / "shardwise",
        package,
        ignore=shutil.ignore_patterns("*.so", "lib", "include", "share", "__pycache__"),
    )
    built = tmp_path / "lib" / "shardwise"
    for item in built.iterdir():
        if item.is_dir():
            shutil.copytree(item, package / item.name, symlinks=True)
        else:
            shutil.copy2(item, package / item.name)
    code = (
        "import shardwise, torch; "
        "x = torch.randn(1001); "
        f"assert shardwise.__file__.startswith({str(package)!r}), shardwise.__file__; "
        "assert torch.equal(shardwise.cast(x, torch.bfloat16), x.to(torch.bfloat16)); "
        "print('ok')"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path / "site")
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0 and ran.stdout.strip() == "ok", ran.stdout + ran.stderr
