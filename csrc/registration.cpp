// Every op schema of shardwise, in one place. Device implementations are registered beside their
// kernels (TORCH_LIBRARY_IMPL(shardwise, CPU|CUDA|Autograd, m)); fake kernels for torch.compile
// live in python/shardwise/ops/.
#include <torch/library.h>

TORCH_LIBRARY(shardwise, m) {
  // precision/: mixed-precision casts (see precision/cast_math.h for the rounding rules).
  m.def("cast(Tensor input, ScalarType dtype) -> Tensor");
  m.def("cast_check_finite(Tensor input, ScalarType dtype) -> (Tensor, Tensor)");
  m.def("cast_stochastic_bf16(Tensor input, int seed, int offset=0) -> Tensor");
  m.def("multi_cast_(Tensor[] inputs, Tensor(a!)[] outputs) -> Tensor");

  // backend/: functional collectives over a named process group (any backend).
  m.def("all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor");
  m.def("all_gather_into_tensor(Tensor input, int group_size, str group_name) -> Tensor");
  m.def(
      "reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, str group_name) -> "
      "Tensor");

  // sharding/: the fused copies around FSDP's all-gather and reduce-scatter (flat_layout.h).
  m.def(
      "all_gather_copy_in(Tensor[] shards, int[] numels, int world_size, int rank, "
      "ScalarType dtype) -> Tensor");
  m.def("all_gather_copy_out(Tensor gathered, int[] numels, int world_size) -> Tensor[]");
  m.def(
      "all_gather_copy_out_(Tensor gathered, int[] numels, int world_size, Tensor(a!)[] params) "
      "-> ()");
  m.def(
      "reduce_scatter_copy_in(Tensor?[] grads, int[] numels, int world_size, ScalarType dtype, "
      "float scale=1.0) -> Tensor");
  m.def(
      "reduce_scatter_copy_in_(Tensor?[] grads, int[] numels, int world_size, float scale, "
      "Tensor(a!) buffer) -> ()");
  m.def(
      "reduce_scatter_copy_out(Tensor reduced, int[] numels, int world_size, int rank, "
      "ScalarType dtype, float scale=1.0) -> Tensor[]");
  m.def(
      "reduce_scatter_copy_out_(Tensor reduced, int[] numels, int world_size, int rank, "
      "float scale, Tensor(a!)[] shard_grads, bool accumulate=True) -> ()");

  // optim/: fused multi-tensor AdamW and SGD steps on float32 parameters (optim/optim_math.h);
  // low_precision is empty or one bfloat16/float16 copy per parameter, written in the same pass.
  m.def(
      "fused_adamw_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] low_precision, float lr, float beta1, float beta2, "
      "float eps, float weight_decay, int step, float grad_scale=1.0) -> ()");
  m.def(
      "fused_sgd_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, "
      "Tensor(d!)[] low_precision, float lr, float momentum, float dampening, float weight_decay, "
      "bool nesterov, bool first_step, float grad_scale=1.0) -> ()");
  // LAMB's two passes (optim/lamb.h): the moments and each tensor's sums of param^2 and
  // direction^2 ([n, 2] float64), then the step of each tensor by its scaled_steps value
  // (step_size * trust ratio, taken from the sums added up per parameter and across ranks).
  m.def(
      "fused_lamb_moments_(Tensor[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, float beta1, float beta2, float eps, float weight_decay, "
      "bool eps_inside_sqrt=False, float grad_scale=1.0) -> Tensor");
  m.def(
      "fused_lamb_apply_(Tensor(a!)[] params, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, "
      "Tensor(d!)[] low_precision, Tensor scaled_steps, float beta1, float beta2, float eps, "
      "float weight_decay, bool eps_inside_sqrt=False) -> ()");
}
