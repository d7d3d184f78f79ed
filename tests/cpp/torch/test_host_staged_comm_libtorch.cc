// The host-staged path CUDA tensors take when ranks share a GPU, run on CPU tensors over thread
// ranks: every op against its exact result, with contiguous tensors (staged in place) and
// non-contiguous ones (staged through a host copy, then copied back), as on a GPU. Catches a
// wrong op mapping, a result not copied back, all-to-all byte splits misread, send/recv peers
// swapped, and ranks that disagree about sharing a device (which would deadlock: half on NCCL,
// half on the host).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "backend/host_staged_comm.hpp"
#include "distributed/process_group.h"
#include "thread_group.h"

namespace {

using shardwise::backend::HostStagedComm;
using shardwise::collectives::ReduceOp;

constexpr int kWorld = 3;

// Rank r's 4 x 5 input, and a non-contiguous view of the same values (a transposed buffer).
torch::Tensor input(int rank) { return torch::arange(20, torch::kFloat).view({4, 5}) + 100 * rank; }
torch::Tensor strided(const torch::Tensor& t) { return t.t().contiguous().t(); }

void on_comms(const std::function<void(int, HostStagedComm&)>& fn) {
  on_thread_ranks(kWorld, "staged", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    HostStagedComm comm(*group->getBackend(c10::DeviceType::CPU));
    fn(rank, comm);
  });
}

TEST(HostStagedComm, AllReduceAndBroadcastCopyTheirResultsBack) {
  on_comms([](int rank, HostStagedComm& comm) {
    for (bool contiguous : {true, false}) {
      torch::Tensor x = contiguous ? input(rank) : strided(input(rank));
      ASSERT_EQ(x.is_contiguous(), contiguous);
      comm.allreduce(x, ReduceOp::kSum);
      EXPECT_TRUE(torch::equal(x, 3 * input(0) + 300)) << "contiguous " << contiguous;
      torch::Tensor m = contiguous ? input(rank) : strided(input(rank));
      comm.allreduce(m, ReduceOp::kMax);
      EXPECT_TRUE(torch::equal(m, input(2)));
      torch::Tensor b = contiguous ? input(rank) : strided(input(rank));
      comm.broadcast(b, 1);
      EXPECT_TRUE(torch::equal(b, input(1)));
    }
  });
}

TEST(HostStagedComm, AllGatherAndReduceScatterFillTheirOutputs) {
  on_comms([](int rank, HostStagedComm& comm) {
    for (bool contiguous : {true, false}) {
      torch::Tensor out = torch::zeros({kWorld * 4, 5});
      torch::Tensor target = contiguous ? out : strided(out);
      comm.all_gather(target, input(rank));
      EXPECT_TRUE(torch::equal(target, torch::cat({input(0), input(1), input(2)})));
      torch::Tensor shard = contiguous ? torch::zeros({4, 5}) : strided(torch::zeros({4, 5}));
      comm.reduce_scatter(shard, torch::cat({input(rank), input(rank), input(rank)}),
                          ReduceOp::kSum);
      EXPECT_TRUE(torch::equal(shard, input(0) + input(1) + input(2)));
    }
  });
}

TEST(HostStagedComm, AllToAllMovesByteBlocksAndRejectsGaps) {
  on_comms([](int rank, HostStagedComm& comm) {
    // Rank r sends (p + 1) floats of value 10 * r + p to peer p.
    std::vector<float> values;
    std::vector<size_t> send_offsets, send_bytes, recv_offsets, recv_bytes;
    size_t sent = 0, received = 0;
    for (int p = 0; p < kWorld; ++p) {
      for (int k = 0; k <= p; ++k) values.push_back(static_cast<float>(10 * rank + p));
      send_offsets.push_back(sent);
      send_bytes.push_back((p + 1) * sizeof(float));
      sent += send_bytes.back();
      recv_offsets.push_back(received);
      recv_bytes.push_back((rank + 1) * sizeof(float));
      received += recv_bytes.back();
    }
    const torch::Tensor in = torch::tensor(values);
    torch::Tensor out = torch::full({static_cast<int64_t>(received / sizeof(float))}, -1.0f);
    comm.alltoall(out, in, send_offsets, send_bytes, recv_offsets, recv_bytes);
    for (int p = 0; p < kWorld; ++p) {
      const torch::Tensor block = out.narrow(0, p * (rank + 1), rank + 1);
      EXPECT_TRUE(torch::equal(block, torch::full({rank + 1}, 10.0f * p + rank))) << "from " << p;
    }
    std::vector<size_t> gapped = send_offsets;
    gapped[1] += 4;
    try {
      comm.alltoall(out, in, gapped, send_bytes, recv_offsets, recv_bytes);
      ADD_FAILURE() << "a gap between send blocks was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("send block 1 starts at byte"), std::string::npos);
    }
  });
}

TEST(HostStagedComm, SendAndReceiveReachTheNamedPeer) {
  on_comms([](int rank, HostStagedComm& comm) {
    const int next = (rank + 1) % kWorld, previous = (rank + kWorld - 1) % kWorld;
    if (rank % 2 == 0) comm.send(input(rank), next);
    torch::Tensor got = strided(torch::zeros({4, 5}));
    if (rank != 0) comm.recv(got, previous);
    if (rank % 2 == 1) comm.send(input(rank), next);
    if (rank == 0) comm.recv(got, previous);
    EXPECT_TRUE(torch::equal(got, input(previous)));
  });
}

TEST(HostStagedComm, RanksAgreeWhetherTheyShareADevice) {
  for (const auto& ids :
       std::vector<std::vector<std::string>>{{"h/0", "h/1", "g/0"}, {"h/0", "h/1", "h/0"}}) {
    const bool shared = ids[0] == ids[2];
    on_threads_with_store(kWorld, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
      EXPECT_EQ(shardwise::backend::ranks_share_a_device(store, rank, kWorld, ids[rank]), shared)
          << "rank " << rank;
    });
  }
}

TEST(HostStagedComm, TheEnvironmentChoiceIsValidated) {
  using CudaComm = shardwise::backend::ShardwiseOptions::CudaComm;
  EXPECT_EQ(shardwise::distributed::cuda_comm_from(nullptr), CudaComm::kAuto);
  EXPECT_EQ(shardwise::distributed::cuda_comm_from("host"), CudaComm::kHost);
  EXPECT_EQ(shardwise::distributed::cuda_comm_from("nccl"), CudaComm::kNccl);
  try {
    shardwise::distributed::cuda_comm_from("gloo");
    ADD_FAILURE() << "SHARDWISE_CUDA_COMM=gloo was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("use auto"), std::string::npos) << e.what();
  }
}

}  // namespace
