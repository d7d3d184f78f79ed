#!/usr/bin/env bash
# What the built extension links and which C++ runtime a process loads (make test-gpu runs it
# after the build). A C++ runtime linked statically into shardwise._C or libshardwise and exported
# from it (its __cxa_*/_Unwind_* symbols defined there) lets the exceptions thrown through the
# library meet two unwinders: a crash instead of a Python error.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
echo "CC=${CC:-unset} CXX=${CXX:-unset}; c++ is $(command -v c++ || echo none)"
for compiler in c++ g++ /usr/bin/g++; do
  command -v "$compiler" >/dev/null && echo "$compiler: $("$compiler" --version | head -1)"
done
"$PY" -c 'import sysconfig; print("python CXX:", sysconfig.get_config_var("CXX"))'
# A compiler wrapper (a script in front of the real g++) may add flags such as -static-libstdc++.
for compiler in ${CXX:-} ${CC:-}; do
  if [ -f "$compiler" ] && head -c 2 "$compiler" | grep -q '#!'; then
    echo "== $compiler is a script:"
    grep -vE '^\s*(#|$)' "$compiler" | head -20
  fi
done
for f in python/shardwise/_C*.so python/shardwise/lib/libshardwise.so; do
  [ -e "$f" ] || continue
  echo "== $f"
  readelf -d "$f" | grep -E 'NEEDED|RUNPATH|RPATH' | sed 's/^ *//'
  echo "C++ runtime symbols it defines: $(nm -D --defined-only "$f" 2>/dev/null |
    grep -cE ' (__cxa_|_Unwind_|__gxx_personality)')"
  strings "$f" | grep -m3 -E '^GCC: \(' || true
done
"$PY" - <<'PY'
import os

import shardwise  # noqa: F401

maps = open(f"/proc/{os.getpid()}/maps").read().split("\n")
runtime = sorted({line.split()[-1] for line in maps if "libstdc++" in line or "libgcc_s" in line})
print("C++ runtime loaded:", runtime)
PY
