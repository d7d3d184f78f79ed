"""Builds shardwise._C with torch.utils.cpp_extension.

CUDA sources (*.cu and *_cuda.cpp under csrc/) are compiled when the installed torch has CUDA
and nvcc is found; SHARDWISE_WITH_CUDA=0 forces a CPU-only build, =1 requires CUDA. Without a GPU
to detect, the CUDA architectures default to sm_80 and sm_90 (+PTX); set TORCH_CUDA_ARCH_LIST to
choose others. Put ccache in front with PATH=/usr/lib/ccache:$PATH and
PYTORCH_NVCC="ccache nvcc" (the Makefile does).
"""

import os
from pathlib import Path

import torch
from setuptools import setup
from torch.utils import cpp_extension

ROOT = Path(__file__).parent
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


def sources(with_cuda: bool) -> list[str]:
    files = sorted(CSRC.rglob("*.cc")) + sorted(CSRC.rglob("*.cpp"))
    cuda_files = sorted(CSRC.rglob("*.cu")) + [f for f in files if f.stem.endswith("_cuda")]
    files = [f for f in files if not f.stem.endswith("_cuda")]
    if with_cuda:
        files += cuda_files
    return [str(f.relative_to(ROOT)) for f in files]


def nccl_flags() -> tuple[list[str], list[str]]:
    """Include dirs and link args for the NCCL that torch's CUDA wheels bring (nvidia-nccl-*),
    or one installed beside the CUDA toolkit."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia.nccl")
    if spec is not None and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        lib = root / "lib"
        return [str(root / "include")], [f"-L{lib}", "-l:libnccl.so.2", f"-Wl,-rpath,{lib}"]
    home = Path(cpp_extension.CUDA_HOME or "/usr/local/cuda")
    if (home / "include" / "nccl.h").exists():
        return [str(home / "include")], ["-lnccl"]
    raise RuntimeError(
        "building with CUDA needs NCCL: install torch's CUDA wheel (it brings nvidia-nccl) or "
        "NCCL beside the CUDA toolkit, or build CPU-only with SHARDWISE_WITH_CUDA=0"
    )


def extension():
    with_cuda = want_cuda()
    if with_cuda and "TORCH_CUDA_ARCH_LIST" not in os.environ and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX"
    define = [("SHARDWISE_WITH_CUDA", "1")] if with_cuda else []
    args = {"cxx": ["-O3", "-Wall"], "nvcc": ["-O3"]}
    kind = cpp_extension.CUDAExtension if with_cuda else cpp_extension.CppExtension
    include_dirs, link_args = nccl_flags() if with_cuda else ([], [])
    return kind(
        name="shardwise._C",
        sources=sources(with_cuda),
        include_dirs=[str(CSRC), *include_dirs],
        define_macros=define,
        extra_compile_args=args,
        extra_link_args=link_args,
    )


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
