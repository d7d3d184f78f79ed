// CPU executor of copy runs: one typed loop per (source, destination, accumulate) combination,
// with the common unscaled cases handed to memcpy or the run-time-dispatched cast kernels.
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/cpu_features.h"
#include "precision/cast_kernels.h"
#include "sharding/copy_runs.h"

namespace shardwise::sharding {
namespace {

template <Element kSrc, Element kDst, bool kAccumulate>
void copy_typed(const CopyRun& run, double scale) {
  using Src = typename ElementTraits<kSrc>::Storage;
  using Dst = typename ElementTraits<kDst>::Storage;
  using Compute = ComputeType<kSrc, kDst>;
  Dst* dst = static_cast<Dst*>(run.dst);
  if (run.src == nullptr) {
    if (!kAccumulate) std::memset(dst, 0, sizeof(Dst) * run.count);
    return;
  }
  const Src* src = static_cast<const Src*>(run.src);
  const Compute factor = static_cast<Compute>(scale);
  for (int64_t k = 0; k < run.count; ++k) {
    dst[k] = copy_element<kSrc, kDst, kAccumulate>(src[k], dst[k], factor);
  }
}

template <Element kSrc, Element kDst>
void copy_pair(const CopyRun& run, const CopyRunsOptions& options) {
  if (options.accumulate) {
    copy_typed<kSrc, kDst, true>(run, options.scale);
  } else {
    copy_typed<kSrc, kDst, false>(run, options.scale);
  }
}

template <Element kSrc>
void copy_from(const CopyRun& run, const CopyRunsOptions& options) {
  switch (options.dst) {
    case Element::kFloat32:
      return copy_pair<kSrc, Element::kFloat32>(run, options);
    case Element::kFloat64:
      return copy_pair<kSrc, Element::kFloat64>(run, options);
    case Element::kBFloat16:
      return copy_pair<kSrc, Element::kBFloat16>(run, options);
    case Element::kFloat16:
      return copy_pair<kSrc, Element::kFloat16>(run, options);
  }
}

void copy_generic(const CopyRun& run, const CopyRunsOptions& options) {
  switch (options.src) {
    case Element::kFloat32:
      return copy_from<Element::kFloat32>(run, options);
    case Element::kFloat64:
      return copy_from<Element::kFloat64>(run, options);
    case Element::kBFloat16:
      return copy_from<Element::kBFloat16>(run, options);
    case Element::kFloat16:
      return copy_from<Element::kFloat16>(run, options);
  }
}

bool as_cast_format(Element element, precision::Format* format) {
  switch (element) {
    case Element::kFloat32:
      *format = precision::Format::kFloat32;
      return true;
    case Element::kBFloat16:
      *format = precision::Format::kBFloat16;
      return true;
    case Element::kFloat16:
      *format = precision::Format::kFloat16;
      return true;
    default:
      return false;
  }
}

}  // namespace

size_t element_bytes(Element element) {
  return element == Element::kFloat64 ? 8 : element == Element::kFloat32 ? 4 : 2;
}

const char* element_name(Element element) {
  static const char* names[] = {"float32", "float64", "bfloat16", "float16"};
  return names[static_cast<int>(element)];
}

void copy_runs_cpu(const CopyRun* runs, int64_t count, const CopyRunsOptions& options) {
  const bool plain = options.scale == 1.0 && !options.accumulate;
  precision::CastOptions cast;
  const bool vector_cast = plain && as_cast_format(options.src, &cast.src) &&
                           as_cast_format(options.dst, &cast.dst) &&
                           precision::is_supported_cast(cast.src, cast.dst);
  const auto isa = active_cpu_isa();
  for (int64_t r = 0; r < count; ++r) {
    const CopyRun& run = runs[r];
    if (run.count <= 0) continue;
    if (run.src != nullptr && plain && options.src == options.dst) {
      std::memcpy(run.dst, run.src, run.count * element_bytes(options.dst));
    } else if (run.src != nullptr && vector_cast) {
      precision::cast_cpu(run.src, run.dst, run.count, cast, isa);
    } else {
      copy_generic(run, options);
    }
  }
}

}  // namespace shardwise::sharding
