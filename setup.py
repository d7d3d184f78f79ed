"""Builds shardwise: libshardwise.so with CMake (CMakeLists.txt, the library C++ programs link
too), installed into the package with its headers and CMake package (shardwise.cmake_prefix_path),
then the Python module shardwise._C (torch.utils.cpp_extension) linked against it.

The CUDA kernels and NCCL are built when the installed torch has CUDA and nvcc is found;
SHARDWISE_WITH_CUDA=0 forces a CPU-only build, =1 requires CUDA. The CUDA architectures default
to sm_80 and sm_90 (+PTX); set TORCH_CUDA_ARCH_LIST to choose others. Put ccache in front with
PATH=/usr/lib/ccache:$PATH (the Makefile does; nvcc gets ccache as CMake's launcher).
"""

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import torch
from setuptools import setup
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"


def cuda_home() -> Path | None:
    """torch's CUDA_HOME, or, where that has no headers (torch guesses /usr/local when nvcc there
    is only a wrapper script), the toolkit nvcc really lives in or /usr/local/cuda."""
    home = cpp_extension.CUDA_HOME
    if home is None or not (Path(home) / "bin" / "nvcc").exists():
        return None
    candidates = [Path(home), (Path(home) / "bin" / "nvcc").resolve().parent.parent]
    candidates.append(Path("/usr/local/cuda"))
    for candidate in candidates:
        if (candidate / "include" / "cuda_runtime_api.h").exists() and (
            candidate / "bin" / "nvcc"
        ).exists():
            cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"] = str(candidate)
            return candidate
    return None


def want_cuda() -> bool:
    choice = os.environ.get("SHARDWISE_WITH_CUDA", "auto").lower()
    nvcc_found = cuda_home() is not None
    available = torch.version.cuda is not None and nvcc_found
    if choice in ("0", "off", "false"):
        return False
    if choice in ("1", "on", "true"):
        if not available:
            raise RuntimeError(
                "SHARDWISE_WITH_CUDA=1 but the installed torch has no CUDA or nvcc was not found "
                f"(torch.version.cuda={torch.version.cuda}, CUDA_HOME={cpp_extension.CUDA_HOME}); "
                "install a CUDA build of torch and the CUDA toolkit, or unset SHARDWISE_WITH_CUDA"
            )
        return True
    if choice != "auto":
        raise ValueError(f"SHARDWISE_WITH_CUDA={choice!r}; use 0, 1 or auto")
    return available


def cmake_list(name: str) -> list[str]:
    """A list from cmake/sources.cmake, the one list of sources CMake builds from too."""
    text = (ROOT / "cmake" / "sources.cmake").read_text()
    match = re.search(rf"^set\({name}\n(.*?)^\)", text, re.MULTILINE | re.DOTALL)
    if match is None:
        raise RuntimeError(f"cmake/sources.cmake has no list {name}")
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


def shared_cxx_runtime_flag() -> str:
    """The link flag that pins the shared C++ runtime (CMakeLists.txt's
    SHARDWISE_SHARED_CXX_RUNTIME): the module must share torch's libstdc++ and libgcc_s, also
    when the compiler links them statically by default."""
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r'^set\(SHARDWISE_SHARED_CXX_RUNTIME\s+"([^"]+)"\)', text, re.MULTILINE)
    if match is None:
        raise RuntimeError("CMakeLists.txt has no SHARDWISE_SHARED_CXX_RUNTIME")
    return match.group(1)


def build_library(prefix: Path, build_dir: Path, with_cuda: bool) -> None:
    """Builds libshardwise.so with CMake (CMakeLists.txt, tests off) and installs it, its headers
    and its CMake package into `prefix` (the package folder: shardwise/{lib,include,share})."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError(
            "building shardwise needs CMake >= 3.22: pip install cmake, or apt-get install cmake"
        )
    configure = [
        cmake, "-S", str(ROOT), "-B", str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_INSTALL_LIBDIR=lib",
        "-DSHARDWISE_BUILD_TESTS=OFF",
        f"-DSHARDWISE_WITH_CUDA={'ON' if with_cuda else 'OFF'}",
        f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
    ]  # fmt: skip
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    home = cuda_home()
    if home is not None and torch.version.cuda is not None:
        # A CUDA torch's CMake config enables CUDA itself, even for a CPU-only shardwise.
        configure += [
            f"-DCMAKE_CUDA_COMPILER={home / 'bin' / 'nvcc'}",
            f"-DCUDA_TOOLKIT_ROOT_DIR={home}",
            f"-DCUDAToolkit_ROOT={home}",
        ]
        if shutil.which("ccache"):
            configure.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
    jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
    for command in (
        configure,
        [cmake, "--build", str(build_dir), "-j", jobs],
        [cmake, "--install", str(build_dir), "--prefix", str(prefix)],
    ):
        subprocess.run(
            command, check=True, stdout=subprocess.DEVNULL if "--install" in command else None
        )


def torch_versions():
    """python/shardwise/_torch_versions.py, loaded by path (the package itself needs the library
    this script builds): what an installed CMake package says of the torch it runs with."""
    spec = importlib.util.spec_from_file_location(
        "_torch_versions", ROOT / "python" / "shardwise" / "_torch_versions.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def use_prebuilt_library(source: Path, prefix: Path) -> None:
    """Copies a `cmake --install` prefix of libshardwise (SHARDWISE_LIBRARY_PREFIX) into `prefix`
    instead of building it: the C++ library built once, the Python module built against it.
    Refused unless it was built against this torch's minor version."""
    config = source / "share" / "cmake" / "shardwise" / "shardwiseConfig.cmake"
    library = source / "lib" / "libshardwise.so"
    if not config.is_file() or not library.exists():
        raise RuntimeError(
            f"SHARDWISE_LIBRARY_PREFIX={source} is not a cmake --install prefix of shardwise "
            f"(no {library.relative_to(source)} or {config.relative_to(source)}); "
            "run cmake --install BUILD --prefix DIR first, or unset SHARDWISE_LIBRARY_PREFIX"
        )
    refused = torch_versions().mismatch(source, torch.__version__)
    if refused is not None:
        raise RuntimeError(f"SHARDWISE_LIBRARY_PREFIX={source}: {refused}; or unset it")
    for folder in ("lib", "include", "share"):
        shutil.rmtree(prefix / folder, ignore_errors=True)
        shutil.copytree(source / folder, prefix / folder, symlinks=True)


class BuildExt(cpp_extension.BuildExtension):
    """Builds the library first, then shardwise._C (the pybind11 glue) linked against it; the
    library lands in the package (shardwise/lib) beside the module, which finds it by RPATH."""

    def finalize_options(self):
        # A --build-temp given to build_ext itself is kept; otherwise (setuptools' default, or
        # pip's temporary folder for an editable install) the module compiles in the clone.
        self.requested_build_temp = self.build_temp
        super().finalize_options()

    def run(self):
        # setuptools clears `inplace` while it builds (it copies the module afterwards): note it.
        self.into_source = bool(self.inplace) or getattr(self, "editable_mode", False)
        super().run()

    def build_extensions(self):
        with_cuda = want_cuda()
        package = Path(self.get_ext_fullpath("shardwise._C")).resolve().parent
        if getattr(self, "into_source", False):
            # An editable install copies only the module back into the source tree: put the
            # library there directly.
            package = ROOT / "python" / "shardwise"
        flavour = f"torch{torch.__version__}-{'cuda' if with_cuda else 'cpu'}"
        # A lasting build folder per torch (not pip's temporary one), so rebuilds are incremental.
        prebuilt = os.environ.get("SHARDWISE_LIBRARY_PREFIX")
        if prebuilt:
            use_prebuilt_library(Path(prebuilt).resolve(), package)
        else:
            build_library(package, ROOT / "build" / f"cmake-python-{flavour}", with_cuda)
        # The module's objects in a lasting folder of the clone too: pip's editable build would
        # compile in a temporary one outside it, which the compiler cache's base directory
        # cannot rewrite, so no other clone (CI's) would hit the cache.
        if self.requested_build_temp is None:
            self.build_temp = str(ROOT / "build" / f"python-module-{flavour}")
        for ext in self.extensions:
            ext.library_dirs.append(str(package / "lib"))
            ext.libraries.append("shardwise")
            ext.extra_link_args += ["-Wl,-rpath,$ORIGIN/lib", shared_cxx_runtime_flag()]
        super().build_extensions()


def extension():
    return cpp_extension.CppExtension(
        name="shardwise._C",
        sources=cmake_list("SHARDWISE_PYTHON_SOURCES"),
        include_dirs=[str(CSRC)],
        # C++20 as the library (torch before 2.13 compiles extensions as C++17 by default), and
        # no debug information, as the library's Release build: Python's own CFLAGS carry -g,
        # which costs a third of these pybind11-heavy files' compile time (fsdp_python.cpp on
        # one core: 27.7 s with it, 19.0 s without), in every build of the module.
        extra_compile_args={"cxx": ["-O3", "-Wall", "-std=c++20", "-g0"]},
    )


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExt.with_options(use_ninja=True)},
)
