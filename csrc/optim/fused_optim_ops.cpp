// The fused optimizer ops on the CPU (spans cut into pieces of kGrain elements, shared between
// threads by at::parallel_for) and the C++ API of fused_optim_ops.h, which calls through the
// dispatcher.
#include "optim/fused_optim_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "optim/fused_optim_impl.h"

namespace shardwise::optim {
namespace {

constexpr int64_t kGrain = int64_t{1} << 16;  // elements per parallel piece

// Every span cut into pieces of at most kGrain elements, so threads share one large partition.
template <typename Span>
std::vector<Span> pieces_of(const std::vector<Span>& spans) {
  std::vector<Span> pieces;
  for (const Span& span : spans) {
    for (int64_t first = 0; first < span.count; first += kGrain) {
      pieces.push_back(slice(span, first, std::min(kGrain, span.count - first)));
    }
  }
  return pieces;
}

void fused_adamw_cpu_op(at::TensorList params,
                        at::TensorList grads,
                        at::TensorList exp_avgs,
                        at::TensorList exp_avg_sqs,
                        at::TensorList low_precision,
                        double lr,
                        double beta1,
                        double beta2,
                        double eps,
                        double weight_decay,
                        int64_t step,
                        double grad_scale) {
  const AdamWOptions options =
      checked_adamw_options(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  const auto pieces = pieces_of(adamw_spans({params, grads, exp_avgs, exp_avg_sqs, low_precision}));
  const AdamWScalars scalars = adamw_scalars(options);
  const CpuIsa isa = active_cpu_isa();
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
    fused_adamw_cpu(pieces.data() + begin, end - begin, scalars, isa);
  });
}

void fused_sgd_cpu_op(at::TensorList params,
                      at::TensorList grads,
                      at::TensorList momentum_buffers,
                      at::TensorList low_precision,
                      double lr,
                      double momentum,
                      double dampening,
                      double weight_decay,
                      bool nesterov,
                      bool first_step,
                      double grad_scale) {
  const SgdOptions options =
      checked_sgd_options(lr, momentum, dampening, weight_decay, nesterov, first_step, grad_scale);
  const auto pieces =
      pieces_of(sgd_spans({params, grads, momentum_buffers, low_precision}, options));
  const SgdScalars scalars = sgd_scalars(options);
  const CpuIsa isa = active_cpu_isa();
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
    fused_sgd_cpu(pieces.data() + begin, end - begin, scalars, isa);
  });
}

TORCH_LIBRARY_IMPL(shardwise, CPU, m) {
  m.impl("fused_adamw_", &fused_adamw_cpu_op);
  m.impl("fused_sgd_", &fused_sgd_cpu_op);
}

}  // namespace
}  // namespace shardwise::optim

namespace shardwise {

void fused_adamw_(at::TensorList params,
                  at::TensorList grads,
                  at::TensorList exp_avgs,
                  at::TensorList exp_avg_sqs,
                  at::TensorList low_precision,
                  const optim::AdamWOptions& o) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("shardwise::fused_adamw_", "")
          .typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                      at::TensorList, double, double, double, double, double, int64_t, double)>();
  op.call(params, grads, exp_avgs, exp_avg_sqs, low_precision, o.lr, o.beta1, o.beta2, o.eps,
          o.weight_decay, o.step, o.grad_scale);
}

void fused_sgd_(at::TensorList params,
                at::TensorList grads,
                at::TensorList momentum_buffers,
                at::TensorList low_precision,
                const optim::SgdOptions& o) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("shardwise::fused_sgd_", "")
                       .typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                   double, double, double, double, bool, bool, double)>();
  op.call(params, grads, momentum_buffers, low_precision, o.lr, o.momentum, o.dampening,
          o.weight_decay, o.nesterov, o.first_step, o.grad_scale);
}

}  // namespace shardwise
