#include "collectives/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "precision/cast_kernels.h"

namespace shardwise::collectives {
namespace {

template <typename T>
void reduce_typed(T* destination, const T* source, size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < count; ++i)
        destination[i] = static_cast<T>(destination[i] + source[i]);
      return;
    case ReduceOp::kProduct:
      for (size_t i = 0; i < count; ++i)
        destination[i] = static_cast<T>(destination[i] * source[i]);
      return;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      break;
  }
  const bool take_min = op == ReduceOp::kMin;
  for (size_t i = 0; i < count; ++i) {
    const T a = destination[i];
    const T b = source[i];
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b)) {
        destination[i] = std::isnan(a) ? a : b;
        continue;
      }
    }
    destination[i] = take_min ? std::min(a, b) : std::max(a, b);
  }
}

void reduce_bool(uint8_t* destination, const uint8_t* source, size_t count, ReduceOp op) {
  const bool logical_or = op == ReduceOp::kSum || op == ReduceOp::kMax;
  for (size_t i = 0; i < count; ++i) {
    const bool a = destination[i] != 0;
    const bool b = source[i] != 0;
    destination[i] = logical_or ? (a || b) : (a && b);
  }
}

}  // namespace

namespace {

precision::Format format_of(Datatype dtype) {
  return dtype == Datatype::kBFloat16 ? precision::Format::kBFloat16 : precision::Format::kFloat16;
}

}  // namespace

void widen(const void* source, void* destination, size_t count, Datatype dtype) {
  if (accumulation_type(dtype) == dtype) {
    if (count > 0) std::memcpy(destination, source, count * element_size(dtype));
    return;
  }
  precision::cast_cpu(source, destination, static_cast<int64_t>(count),
                      {format_of(dtype), precision::Format::kFloat32}, active_cpu_isa());
}

void narrow(const void* source, void* destination, size_t count, Datatype dtype) {
  if (accumulation_type(dtype) == dtype) {
    if (count > 0) std::memcpy(destination, source, count * element_size(dtype));
    return;
  }
  precision::cast_cpu(source, destination, static_cast<int64_t>(count),
                      {precision::Format::kFloat32, format_of(dtype)}, active_cpu_isa());
}

Datatype accumulation_type(Datatype dtype) {
  return dtype == Datatype::kBFloat16 || dtype == Datatype::kFloat16 ? Datatype::kFloat32 : dtype;
}

void check_reduce(Datatype dtype, ReduceOp op) {
  if (op == ReduceOp::kAvg && !is_floating(dtype)) {
    throw std::invalid_argument(std::string("ReduceOp.AVG is defined for floating dtypes, not ") +
                                datatype_name(dtype) + "; use SUM and divide");
  }
}

void reduce_into(void* destination, const void* source, size_t count, Datatype dtype, ReduceOp op) {
  switch (dtype) {
    case Datatype::kFloat32:
      return reduce_typed(static_cast<float*>(destination), static_cast<const float*>(source),
                          count, op);
    case Datatype::kFloat64:
      return reduce_typed(static_cast<double*>(destination), static_cast<const double*>(source),
                          count, op);
    case Datatype::kInt8:
      return reduce_typed(static_cast<int8_t*>(destination), static_cast<const int8_t*>(source),
                          count, op);
    case Datatype::kUInt8:
      return reduce_typed(static_cast<uint8_t*>(destination), static_cast<const uint8_t*>(source),
                          count, op);
    case Datatype::kInt32:
      return reduce_typed(static_cast<int32_t*>(destination), static_cast<const int32_t*>(source),
                          count, op);
    case Datatype::kInt64:
      return reduce_typed(static_cast<int64_t*>(destination), static_cast<const int64_t*>(source),
                          count, op);
    case Datatype::kBool:
      return reduce_bool(static_cast<uint8_t*>(destination), static_cast<const uint8_t*>(source),
                         count, op);
    case Datatype::kBFloat16:
    case Datatype::kFloat16:
      break;
  }
  throw std::logic_error("reduce_into: 16-bit floats are reduced in float32");
}

void reduce_from(
    void* destination, const void* a, const void* b, size_t count, Datatype dtype, ReduceOp op) {
  // In chunks that stay in L1: copy a, then reduce b into it while both are hot.
  constexpr size_t kChunkBytes = 16 << 10;
  const size_t element = element_size(dtype);
  const size_t chunk = kChunkBytes / element;
  char* out = static_cast<char*>(destination);
  const char* left = static_cast<const char*>(a);
  const char* right = static_cast<const char*>(b);
  for (size_t first = 0; first < count; first += chunk) {
    const size_t n = std::min(chunk, count - first);
    if (out != left) std::memcpy(out + first * element, left + first * element, n * element);
    reduce_into(out + first * element, right + first * element, n, dtype, op);
  }
}

void finish_average(void* data, size_t count, Datatype dtype, int divisor) {
  if (dtype == Datatype::kFloat64) {
    double* values = static_cast<double*>(data);
    for (size_t i = 0; i < count; ++i) values[i] /= divisor;
  } else if (dtype == Datatype::kFloat32) {
    float* values = static_cast<float*>(data);
    for (size_t i = 0; i < count; ++i) values[i] /= static_cast<float>(divisor);
  } else {
    throw std::logic_error("finish_average: not a float32/float64 accumulation type");
  }
}

size_t element_size(Datatype dtype) {
  switch (dtype) {
    case Datatype::kFloat64:
    case Datatype::kInt64:
      return 8;
    case Datatype::kFloat32:
    case Datatype::kInt32:
      return 4;
    case Datatype::kBFloat16:
    case Datatype::kFloat16:
      return 2;
    case Datatype::kInt8:
    case Datatype::kUInt8:
    case Datatype::kBool:
      return 1;
  }
  return 1;
}

bool is_floating(Datatype dtype) {
  return dtype == Datatype::kFloat32 || dtype == Datatype::kFloat64 ||
         dtype == Datatype::kBFloat16 || dtype == Datatype::kFloat16;
}

const char* datatype_name(Datatype dtype) {
  static const char* names[] = {"float32", "float64", "bfloat16", "float16", "int8",
                                "uint8",   "int32",   "int64",    "bool"};
  return names[static_cast<int>(dtype)];
}

const char* reduce_op_name(ReduceOp op) {
  static const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX"};
  return names[static_cast<int>(op)];
}

}  // namespace shardwise::collectives
