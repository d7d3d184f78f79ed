#include "common/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

namespace shardwise {
namespace {

constexpr int kNoOverride = -1;
std::atomic<int> g_override{kNoOverride};

CpuIsa detect() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  if (!avx512) {
    return CpuIsa::kScalar;
  }
  return __builtin_cpu_supports("avx512bf16") ? CpuIsa::kAvx512Bf16 : CpuIsa::kAvx512;
#else
  return CpuIsa::kScalar;
#endif
}

CpuIsa checked(CpuIsa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detected_cpu_isa())) {
    throw std::invalid_argument(std::string("CPU instruction set '") + cpu_isa_name(isa) +
                                "' is not supported by this CPU (it supports up to '" +
                                cpu_isa_name(detected_cpu_isa()) + "'); choose a lower one");
  }
  return isa;
}

CpuIsa from_environment() {
  const char* value = std::getenv("SHARDWISE_CPU_ISA");
  if (value == nullptr || *value == '\0') {
    return detected_cpu_isa();
  }
  return checked(parse_cpu_isa(value));
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Bf16:
      return "avx512_bf16";
  }
  return "unknown";
}

CpuIsa parse_cpu_isa(const std::string& name) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (name == cpu_isa_name(isa)) {
      return isa;
    }
  }
  throw std::invalid_argument(
      "unknown CPU instruction set '" + name +
      "' (SHARDWISE_CPU_ISA / cpu_isa); valid: scalar, avx512, avx512_bf16");
}

CpuIsa detected_cpu_isa() {
  static const CpuIsa detected = detect();
  return detected;
}

CpuIsa active_cpu_isa() {
  const int override_isa = g_override.load(std::memory_order_relaxed);
  if (override_isa != kNoOverride) {
    return static_cast<CpuIsa>(override_isa);
  }
  static const CpuIsa from_env = from_environment();
  return from_env;
}

void set_cpu_isa(std::optional<CpuIsa> isa) {
  g_override.store(isa ? static_cast<int>(checked(*isa)) : kNoOverride, std::memory_order_relaxed);
}

}  // namespace shardwise
