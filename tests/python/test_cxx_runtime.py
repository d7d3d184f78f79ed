"""One C++ runtime in the process: exceptions thrown in libshardwise reach Python as errors, and
neither the library nor the module carries a copy of libstdc++ or of the unwinder. Catches a build
whose compiler links the C++ runtime statically (a g++ wrapper adding -static-libstdc++): the
library then binds its own copy of the exception and locale machinery, and the first exception
thrown in it crashed the process ("free(): invalid pointer", SIGSEGV) instead of raising."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import shardwise
import torch
from shardwise import _C

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "scripts" / "gpu_exception_repro.py"
MODES = ["torch_error", "op_error", "pybind_error", "internal"]
if torch.cuda.is_available():
    MODES += [f"{mode}_cuda" for mode in MODES]
# What a copy of the C++ runtime or of the unwinder defines: the exception entry points and the
# locale that every stream uses.
RUNTIME_SYMBOLS = (
    "__cxa_throw",
    "__cxa_allocate_exception",
    "__gxx_personality_v0",
    "_ZNSt6localeD1Ev",
    "_Unwind_RaiseException",
)


@pytest.mark.parametrize("mode", MODES)
def test_exception_reaches_python(mode):
    """Each path in its own process, so a crash fails this test with its signal."""
    proc = subprocess.run(
        [sys.executable, str(REPRO), mode], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert f"{mode.removesuffix('_cuda')} ok:" in proc.stdout, proc.stdout


def _defined_runtime_symbols(path: Path) -> list[str]:
    nm = shutil.which("nm")
    assert nm is not None, "nm (binutils) is needed to read the library's dynamic symbols"
    out = subprocess.run(
        [nm, "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return [line.split()[-1] for line in out.splitlines() if line.split()[-1] in RUNTIME_SYMBOLS]


def test_library_and_module_use_the_shared_cxx_runtime():
    library = Path(shardwise.__file__).parent / "lib" / "libshardwise.so"
    for path in (Path(_C.__file__), library.resolve()):
        assert path.is_file(), path
        assert _defined_runtime_symbols(path) == [], (
            f"{path.name} defines C++ runtime symbols: it was linked against a static libstdc++ "
            "or libgcc (CMakeLists.txt SHARDWISE_SHARED_CXX_RUNTIME should prevent that)"
        )


STATIC_RUNTIME_GXX = ROOT / "tests" / "toolchain" / "static-runtime" / "g++"
THROWER = """
#include <sstream>
#include <stdexcept>
#include <string>
std::string describe(int x) {
  std::ostringstream s;
  s << x;
  if (x < 0) throw std::invalid_argument(s.str());
  return s.str();
}
"""


def _shared_cxx_runtime_flag() -> str:
    import re

    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r'^set\(SHARDWISE_SHARED_CXX_RUNTIME\s+"([^"]+)"\)', text, re.M).group(1)


@pytest.mark.parametrize("pinned", [False, True])
def test_the_link_flag_keeps_a_static_runtime_out(tmp_path, pinned):
    """The GPU image's compiler, reproduced (a g++ whose library path meets libstdc++.a first):
    a shared library linked with it carries its own copy of the runtime, unless the link names
    the shared runtime as CMakeLists.txt's SHARDWISE_SHARED_CXX_RUNTIME does."""
    if shutil.which("g++") is None:
        pytest.fail("g++ is needed: it builds shardwise")
    source = tmp_path / "thrower.cc"
    source.write_text(THROWER)
    library = tmp_path / "libthrower.so"
    command = [str(STATIC_RUNTIME_GXX), "-fPIC", "-shared", str(source), "-o", str(library)]
    subprocess.run(command + ([_shared_cxx_runtime_flag()] if pinned else []), check=True)
    defined = _defined_runtime_symbols(library)
    if pinned:
        assert defined == [], defined
    else:
        assert "__cxa_throw" in defined, "the wrapper no longer reproduces a static runtime"
