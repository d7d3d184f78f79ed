#!/usr/bin/env bash
# Why C++ exceptions crashed shardwise on a GPU image (make gpu-diagnose; about 4 minutes on 16
# cores). Facts first (compilers, the C++ runtime torch was built with and the one a process loads,
# who defines the unwinder's symbols), then the same exception paths (scripts/gpu_exception_repro.py,
# one process each) through:
#   inline_<cxx>   a minimal torch extension built by torch.utils.cpp_extension with that compiler
#   va             shardwise built as make test-gpu builds it (the default compiler)
#   vb             the same library, the Python module built with the other compiler
# and a backtrace (cuda-gdb, the image's only debugger) of the first path that crashes.
# Everything lands in OUT (default build/gpu-diagnose): diag.log and logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PY:-python3}
OUT=${OUT:-build/gpu-diagnose}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
logs=$OUT/logs
mkdir -p "$logs"
exec > >(tee "$OUT/diag.log") 2>&1
export PYTHONUNBUFFERED=1 MAX_JOBS=$(nproc)

section() { printf '\n==== %s (%ss)\n' "$1" "$SECONDS"; }

section facts
uname -a
grep PRETTY /etc/os-release
env | grep -E '^(LD_|CC=|CXX=|CFLAGS|CXXFLAGS|LDFLAGS|PATH=|CUDA|TORCH|PYTHON|CONDA)' | sort
echo "python: $(command -v "$PY") $("$PY" -V 2>&1)"
for c in c++ g++ gcc /usr/bin/g++ /usr/bin/c++ /opt/gcc/bin/g++ clang++; do
  p=$(command -v "$c" 2>/dev/null) && echo "$c -> $(readlink -f "$p"): $("$c" --version | head -1)"
done
ls /usr/bin/g++* /usr/bin/x86_64-linux-gnu-g++* /opt/gcc/bin 2>/dev/null | tr '\n' ' '
echo
[ -x /opt/gcc/bin/g++ ] && /opt/gcc/bin/g++ -v 2>&1 | grep -E 'Configured with|^gcc version'
[ -x /opt/gcc/bin/g++ ] && echo "/opt/gcc specs: $(/opt/gcc/bin/g++ -dumpspecs | grep -c static)" \
  "lines naming static; libstdc++ it links: $(/opt/gcc/bin/g++ -print-file-name=libstdc++.so)"
ldconfig -p | grep -E 'libstdc\+\+|libgcc_s|libunwind' | sed 's/^\s*//'
# Which C++ runtime a plain -lstdc++ links with each compiler (the linker's --trace): a static
# archive here is what put a private runtime into libshardwise on one GPU image.
for c in ${CXX:-} /usr/bin/g++; do
  [ -x "$c" ] || continue
  echo "$c -lstdc++ links: $(echo 'int f() { return 0; }' | "$c" -x c++ -shared -fPIC - \
    -o /tmp/runtime_probe.so -Wl,--trace -lstdc++ 2>&1 | grep -m1 -E 'libstdc\+\+\.(a|so)')"
done
ls -la /opt/gcc/lib64/libstdc++.so* 2>/dev/null
"$PY" - <<'PY'
import torch, sysconfig
print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11 abi", torch._C._GLIBCXX_USE_CXX11_ABI)
for name in ("_PYBIND11_COMPILER_TYPE", "_PYBIND11_STDLIB", "_PYBIND11_BUILD_ABI"):
    print(name, getattr(torch._C, name, None))
print([l.strip() for l in torch.__config__.show().splitlines() if "GCC" in l or "CXX_COMPILER" in l or "CXX_FLAGS" in l][:4])
print("python CC/CXX:", sysconfig.get_config_var("CC"), "|", sysconfig.get_config_var("CXX"))
import os
print("pybind11 in torch:", open(os.path.join(os.path.dirname(torch.__file__), "include/pybind11/detail/common.h")).read().count("PYBIND11_VERSION_MAJOR"))
try:
    import pybind11
    print("pip pybind11", pybind11.__version__, pybind11.get_include())
except ImportError:
    print("no pip pybind11")
torch.cuda.init()
maps = open(f"/proc/{os.getpid()}/maps").read().split("\n")
libs = sorted({l.split()[-1] for l in maps if ".so" in l})
print("loaded after torch + cuda init:", len(libs))
open("/tmp/loaded_libs.txt", "w").write("\n".join(libs))
PY
echo "-- loaded objects that define unwinder / C++ runtime entry points:"
while read -r lib; do
  [ -f "$lib" ] || continue
  defs=$(nm -D --defined-only "$lib" 2>/dev/null |
    grep -oE ' (_Unwind_RaiseException|_Unwind_Resume|__cxa_throw|__gxx_personality_v0|__cxa_allocate_exception|__cxa_free_exception|__cxa_begin_catch|_ZSt9terminatev)(@.*)?$' |
    tr -d ' ' | tr '\n' ' ')
  [ -n "$defs" ] && echo "$lib: $defs"
done </tmp/loaded_libs.txt

section "inline extensions (torch.utils.cpp_extension, no shardwise)"
cat >/tmp/inline_ext.py <<'PY'
import sys, torch
from torch.utils.cpp_extension import load_inline
src = r'''
#include <torch/extension.h>
#include <stdexcept>
void check_fails() { TORCH_CHECK(false, "inline TORCH_CHECK reached Python"); }
void std_error() { throw std::invalid_argument("inline std::invalid_argument reached Python"); }
int internal() { try { throw std::runtime_error("x"); } catch (const std::exception&) { return 7; } return 0; }
'''
m = load_inline(sys.argv[1], cpp_sources=src, functions=["check_fails", "std_error", "internal"],
                build_directory=sys.argv[2], extra_cflags=["-O1"])
print(sys.argv[1], "internal ->", m.internal(), flush=True)
for f in (m.check_fails, m.std_error):
    try:
        f()
    except Exception as e:
        print(sys.argv[1], "ok:", type(e).__name__, str(e).splitlines()[0], flush=True)
PY
inline_pids=()
for cxx in "${CXX:-c++}" /usr/bin/g++; do
  command -v "$cxx" >/dev/null || continue
  tag=inline_$(echo "$cxx" | tr -c 'a-z0-9\n' _)
  mkdir -p "/tmp/$tag"
  (CXX=$cxx timeout 200 "$PY" /tmp/inline_ext.py "$tag" "/tmp/$tag" >"$logs/$tag.log" 2>&1
   echo "$tag exit $?" >>"$logs/$tag.log") &
  inline_pids+=($!)
done

section "build va: shardwise as make test-gpu builds it"
rm -rf /tmp/va /tmp/vb
mkdir -p /tmp/va
git ls-files -z | xargs -0 cp --parents -t /tmp/va
cp -r /tmp/va /tmp/vb
arch=$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))')
(cd /tmp/va && TORCH_CUDA_ARCH_LIST=$arch SHARDWISE_WITH_CUDA=1 timeout 300 \
  "$PY" setup.py -q build_ext --inplace >"$logs/build-va.log" 2>&1; echo "build va exit $?")
tail -3 "$logs/build-va.log"
wait "${inline_pids[@]}"
cat "$logs"/inline_*.log | grep -vE '^(Emitting|Building|\[|Loading|Detected|Allowing)' | tail -20

section "build vb: the module with /usr/bin/g++ against va's library"
if [ -x /usr/bin/g++ ]; then
  (cd /tmp/vb && CC=/usr/bin/gcc CXX=/usr/bin/g++ SHARDWISE_LIBRARY_PREFIX=/tmp/va/python/shardwise \
    timeout 200 "$PY" setup.py -q build_ext --inplace >"$logs/build-vb.log" 2>&1
   echo "build vb exit $?")
  tail -3 "$logs/build-vb.log"
fi

section "exception paths, one process each"
first_crash=
for variant in va vb; do
  [ -e /tmp/$variant/python/shardwise/lib/libshardwise.so ] || continue
  for mode in torch_error pybind_error op_error internal op_error_cuda internal_cuda; do
    out=$(cd /tmp && PYTHONPATH=/tmp/$variant/python timeout 60 "$PY" \
      "$root/scripts/gpu_exception_repro.py" "$mode" 2>&1)
    rc=$?
    echo "$variant $mode: exit $rc: $(echo "$out" | tail -2 | tr '\n' ' ' | cut -c1-300)"
    [ $rc -ne 0 ] && [ -z "$first_crash" ] && first_crash="$variant $mode"
  done
  (cd /tmp/$variant && PY=$PY timeout 60 bash /tmp/$variant/scripts/toolchain_report.sh) \
    >"$logs/toolchain-$variant.log" 2>&1
  sed 's/^/  /' "$logs/toolchain-$variant.log"
done

if [ -n "$first_crash" ]; then
  set -- $first_crash
  section "where $1 $2 crashes"
  (cd /tmp && PYTHONPATH=/tmp/$1/python LD_DEBUG=bindings LD_DEBUG_OUTPUT=/tmp/bindings \
    timeout 60 "$PY" "$root/scripts/gpu_exception_repro.py" "$2" >/dev/null 2>&1)
  cat /tmp/bindings.* 2>/dev/null | grep -E "symbol \`(_Unwind_RaiseException|_Unwind_Resume|__cxa_throw|__gxx_personality_v0|__cxa_allocate_exception|__cxa_free_exception|_ZSt9terminatev|__cxa_begin_catch)'" |
    grep -E 'shardwise|_C\.|torch_python|libc10\.|libtorch_cpu' | sed -E 's/^ *[0-9]+: *//' | sort | uniq -c | head -40
  command -v cuda-gdb >/dev/null && (cd /tmp && PYTHONPATH=/tmp/$1/python timeout 120 cuda-gdb -batch -q \
    -ex 'set pagination off' -ex 'set print thread-events off' -ex run -ex bt -ex 'info sharedlibrary' \
    --args "$PY" "$root/scripts/gpu_exception_repro.py" "$2" >"$logs/backtrace.log" 2>&1)
  grep -vE '^\[New Thread|^\[Thread|^Download' "$logs/backtrace.log" | grep -B2 -A40 -m1 -E 'signal|SIG' | head -60
  grep -E 'libstdc|libgcc_s|shardwise|_C\.' "$logs/backtrace.log" | tail -12
fi
section done
tar czf "$OUT/logs.tgz" -C "$OUT" logs
