#!/usr/bin/env bash
# Installs the Debian packages the build needs, only those missing: GoogleTest (the C++ test
# framework), ccache, CMake, Ninja, and clang with its sanitizer runtimes (libFuzzer). Needs root (or sudo) on Debian/Ubuntu.
set -euo pipefail
packages=(libgtest-dev ccache cmake ninja-build clang-14 libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -q
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
