// Run-time CPU feature detection for choosing a kernel, torch-free.
//
// Kernels are compiled for several instruction sets in one binary (AVX-512 code is confined to
// functions with target attributes), and `active_cpu_isa()` picks the best one this CPU supports.
// The choice can be lowered, never raised above what the CPU has, through the environment variable
// SHARDWISE_CPU_ISA=scalar|avx512|avx512_bf16 or `set_cpu_isa()`: tests use that to run every
// kernel on one machine, and users to rule out a kernel.
#pragma once

#include <optional>
#include <string>

namespace shardwise {

enum class CpuIsa : int {
  kScalar = 0,      // portable C++, what any x86-64 or Arm CPU runs
  kAvx512 = 1,      // AVX-512 F + BW + VL (+ F16C conversions)
  kAvx512Bf16 = 2,  // the above plus AVX512_BF16 (vcvtneps2bf16)
};

const char* cpu_isa_name(CpuIsa isa);

// Parses "scalar", "avx512" or "avx512_bf16"; throws std::invalid_argument naming the valid ones.
CpuIsa parse_cpu_isa(const std::string& name);

// The best instruction set this CPU and operating system support.
CpuIsa detected_cpu_isa();

// The instruction set kernels use now: the override if one is set, else SHARDWISE_CPU_ISA if set,
// else the detected one.
CpuIsa active_cpu_isa();

// Sets (or with nullopt clears) the override. Throws std::invalid_argument if `isa` is above
// `detected_cpu_isa()`.
void set_cpu_isa(std::optional<CpuIsa> isa);

}  // namespace shardwise
