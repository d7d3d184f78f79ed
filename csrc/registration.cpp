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
}
