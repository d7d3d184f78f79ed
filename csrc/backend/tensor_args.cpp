#include "backend/tensor_args.hpp"

#include <c10/util/Exception.h>

namespace shardwise::backend {

using collectives::Datatype;

Datatype datatype_of(const at::Tensor& tensor, const char* op) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return Datatype::kFloat32;
    case at::kDouble:
      return Datatype::kFloat64;
    case at::kBFloat16:
      return Datatype::kBFloat16;
    case at::kHalf:
      return Datatype::kFloat16;
    case at::kChar:
      return Datatype::kInt8;
    case at::kByte:
      return Datatype::kUInt8;
    case at::kInt:
      return Datatype::kInt32;
    case at::kLong:
      return Datatype::kInt64;
    case at::kBool:
      return Datatype::kBool;
    default:
      TORCH_CHECK_TYPE(false, "shardwise backend: ", op, " does not support dtype ",
                       tensor.scalar_type(), "; supported: float32, float64, bfloat16, float16, ",
                       "int8, uint8, int32, int64, bool (view complex tensors as real)");
  }
}

collectives::ReduceOp reduce_op_of(const c10d::ReduceOp& op,
                                   const at::Tensor& tensor,
                                   const char* name) {
  using collectives::ReduceOp;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK_VALUE(at::isFloatingType(tensor.scalar_type()), "shardwise backend: ", name,
                        " with ReduceOp.AVG needs a floating tensor, got ", tensor.scalar_type(),
                        "; use SUM and divide");
      return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    default:
      TORCH_CHECK_VALUE(false, "shardwise backend: ", name,
                        " supports ReduceOp SUM, AVG, PRODUCT, MIN and MAX, not op #",
                        static_cast<int>(op.op_));
  }
}

void check_cpu(const std::vector<at::Tensor>& tensors, const char* op, const char* argument) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(
        t.device().is_cpu(), "shardwise backend: ", op, ": ", argument, "[", i, "] is on ",
        t.device(),
        "; this operation takes CPU tensors (CUDA ones go through NCCL for all_reduce, ",
        "broadcast, all_gather, all_gather_into_tensor, reduce_scatter_tensor, ",
        "all_to_all_single, send and recv), or use init_process_group('cpu:shardwise,cuda:nccl')");
    TORCH_CHECK(t.layout() == at::kStrided, "shardwise backend: ", op, ": ", argument, "[", i,
                "] is not a dense tensor");
  }
}

bool is_cuda_call(const std::vector<at::Tensor>& tensors, const char* op, const char* argument) {
  if (tensors.empty() || !tensors[0].is_cuda()) {
    check_cpu(tensors, op, argument);
    return false;
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    TORCH_CHECK(tensors[i].is_cuda() && tensors[i].device() == tensors[0].device() &&
                    tensors[i].layout() == at::kStrided,
                "shardwise backend: ", op, ": ", argument, "[", i, "] is on ", tensors[i].device(),
                " but ", argument, "[0] is on ", tensors[0].device(),
                "; pass dense tensors on one device");
  }
  return true;
}

}  // namespace shardwise::backend
