// NcclComm on CUDA: one communicator and one stream per backend and device.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "backend/host_staged_comm.hpp"
#include "backend/nccl_comm.hpp"

namespace shardwise::backend {
namespace {

#define SW_NCCL_CHECK(call, what)                                                             \
  do {                                                                                        \
    const ncclResult_t result_ = (call);                                                      \
    TORCH_CHECK(result_ == ncclSuccess, "shardwise backend: NCCL ", what, " failed on rank ", \
                rank_, ": ", ncclGetErrorString(result_));                                    \
  } while (0)

ncclDataType_t nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kChar:
      return ncclInt8;
    case at::kByte:
    case at::kBool:
      return ncclUint8;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    default:
      TORCH_CHECK_TYPE(false, "shardwise backend (NCCL): unsupported dtype ", t.scalar_type());
  }
}

ncclRedOp_t nccl_op(collectives::ReduceOp op, const at::Tensor& t) {
  const bool is_bool = t.scalar_type() == at::kBool;
  switch (op) {
    case collectives::ReduceOp::kSum:
      return is_bool ? ncclMax : ncclSum;
    case collectives::ReduceOp::kAvg:
      return ncclAvg;
    case collectives::ReduceOp::kProduct:
      return is_bool ? ncclMin : ncclProd;
    case collectives::ReduceOp::kMin:
      return ncclMin;
    case collectives::ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

class CudaNcclComm : public NcclComm {
 public:
  CudaNcclComm(const c10::intrusive_ptr<c10d::Store>& store,
               int rank,
               int size,
               const at::Device& device)
      : rank_(rank), device_(device), stream_(c10::cuda::getStreamFromPool(false, device.index())) {
    ncclUniqueId id;
    const std::string key = "shardwise/nccl/" + std::to_string(device.index());
    if (rank == 0) {
      SW_NCCL_CHECK(ncclGetUniqueId(&id), "ncclGetUniqueId");
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      store->set(key, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
    } else {
      const std::vector<uint8_t> bytes = store->get(key);
      TORCH_CHECK(bytes.size() == sizeof(id), "shardwise backend: malformed ncclUniqueId");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    const c10::cuda::CUDAGuard guard(device);
    SW_NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
  }
  ~CudaNcclComm() override { ncclCommDestroy(comm_); }

  void allreduce(at::Tensor& t, collectives::ReduceOp op) override {
    run(
        [&](cudaStream_t s) {
          SW_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), count(t), nccl_type(t),
                                      nccl_op(op, t), comm_, s),
                        "all_reduce");
        },
        {t});
  }
  void broadcast(at::Tensor& t, int root) override {
    run(
        [&](cudaStream_t s) {
          SW_NCCL_CHECK(
              ncclBroadcast(t.data_ptr(), t.data_ptr(), count(t), nccl_type(t), root, comm_, s),
              "broadcast");
        },
        {t});
  }
  void all_gather(at::Tensor& out, const at::Tensor& in) override {
    run(
        [&](cudaStream_t s) {
          SW_NCCL_CHECK(
              ncclAllGather(in.data_ptr(), out.data_ptr(), count(in), nccl_type(in), comm_, s),
              "all_gather");
        },
        {out, in});
  }
  void reduce_scatter(at::Tensor& out, const at::Tensor& in, collectives::ReduceOp op) override {
    run(
        [&](cudaStream_t s) {
          SW_NCCL_CHECK(ncclReduceScatter(in.data_ptr(), out.data_ptr(), count(out), nccl_type(in),
                                          nccl_op(op, in), comm_, s),
                        "reduce_scatter");
        },
        {out, in});
  }
  void alltoall(at::Tensor& out,
                const at::Tensor& in,
                const std::vector<size_t>& send_offsets,
                const std::vector<size_t>& send_bytes,
                const std::vector<size_t>& recv_offsets,
                const std::vector<size_t>& recv_bytes) override {
    run(
        [&](cudaStream_t s) {
          SW_NCCL_CHECK(ncclGroupStart(), "group start");
          for (size_t p = 0; p < send_bytes.size(); ++p) {
            SW_NCCL_CHECK(ncclSend(static_cast<char*>(in.data_ptr()) + send_offsets[p],
                                   send_bytes[p], ncclUint8, static_cast<int>(p), comm_, s),
                          "all_to_all send");
            SW_NCCL_CHECK(ncclRecv(static_cast<char*>(out.data_ptr()) + recv_offsets[p],
                                   recv_bytes[p], ncclUint8, static_cast<int>(p), comm_, s),
                          "all_to_all recv");
          }
          SW_NCCL_CHECK(ncclGroupEnd(), "group end");
        },
        {out, in});
  }
  void send(const at::Tensor& t, int peer) override {
    run(
        [&](cudaStream_t s) {
          SW_NCCL_CHECK(ncclSend(t.data_ptr(), count(t), nccl_type(t), peer, comm_, s), "send");
        },
        {t});
  }
  void recv(at::Tensor& t, int peer) override {
    run(
        [&](cudaStream_t s) {
          SW_NCCL_CHECK(ncclRecv(t.data_ptr(), count(t), nccl_type(t), peer, comm_, s), "recv");
        },
        {t});
  }

 private:
  static size_t count(const at::Tensor& t) { return static_cast<size_t>(t.numel()); }

  // Orders `body` on our stream after the caller's current stream, and the caller's after it;
  // tells the caching allocator the tensors are in use on our stream.
  template <typename Body>
  void run(Body body, std::vector<at::Tensor> tensors) {
    const c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device_.index());
    cudaEvent_t ready, done;
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    cudaEventRecord(ready, caller.stream());
    cudaStreamWaitEvent(stream_.stream(), ready, 0);
    body(stream_.stream());
    for (const auto& t : tensors) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    }
    cudaEventRecord(done, stream_.stream());
    cudaStreamWaitEvent(caller.stream(), done, 0);
    cudaEventDestroy(ready);
    cudaEventDestroy(done);
  }

  int rank_;
  at::Device device_;
  c10::cuda::CUDAStream stream_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<NcclComm> make_nccl_comm(const c10::intrusive_ptr<c10d::Store>& store,
                                         int rank,
                                         int size,
                                         const at::Device& device) {
  return std::make_unique<CudaNcclComm>(store, rank, size, device);
}

std::string cuda_device_id(const at::Device& device) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  char bus[64] = {};
  const int index = device.index() < 0 ? c10::cuda::current_device() : device.index();
  const cudaError_t result = cudaDeviceGetPCIBusId(bus, sizeof(bus), index);
  TORCH_CHECK(result == cudaSuccess, "shardwise backend: cudaDeviceGetPCIBusId(", index,
              ") failed: ", cudaGetErrorString(result));
  return std::string(host) + "/" + bus;
}

}  // namespace shardwise::backend
