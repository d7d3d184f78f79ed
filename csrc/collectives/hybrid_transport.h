// A Transport that picks, for every peer, the fastest link that reaches it: shared memory for the
// ranks on this rank's host, TCP for the others.
//
// `host_of[r]` names the host of rank r. `local` connects this host's ranks only, numbered by
// their order in the group (local rank = position among the ranks whose host_of equals ours);
// `remote` connects every rank of the group (only the pairs on different hosts are used).
//
// sendrecv sends to `send_peer` while receiving from `recv_peer`. When both peers use the same
// link it forwards the call; when they use different links (a ring crossing a host boundary: the
// left neighbour on this host, the right one across the network), the send half runs on a helper
// thread owned by this transport while the calling thread receives, so both halves progress
// together as the Transport contract requires. A failure of either half aborts both links and
// raises the first error.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/transport.h"

namespace shardwise::collectives {

struct HybridTransportOptions {
  int rank = 0;
  std::vector<int> host_of;  // host index of every rank of the group
};

class HybridTransport : public Transport {
 public:
  HybridTransport(const HybridTransportOptions& options,
                  std::unique_ptr<Transport> local,
                  std::unique_ptr<Transport> remote);
  ~HybridTransport() override;
  HybridTransport(const HybridTransport&) = delete;
  HybridTransport& operator=(const HybridTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(host_of_.size()); }
  using Transport::sendrecv;
  void sendrecv(int send_peer,
                ConstBuffer send,
                int recv_peer,
                size_t recv_bytes,
                const RecvConsumer& consume,
                Tag tag,
                Clock::time_point deadline) override;
  void abort(const std::string& reason) override;
  bool message_waiting(int peer) override;
  std::vector<int> host_of() const override { return host_of_; }

  // Whether `peer` shares this rank's host (and so is reached through `local`).
  bool is_local(int peer) const { return host_of_[peer] == host_of_[rank_]; }

  // This rank's position among the ranks of its own host: its rank in `local`.
  static int local_rank_of(const std::vector<int>& host_of, int rank);
  // How many ranks share the host of `rank`.
  static int local_size_of(const std::vector<int>& host_of, int rank);
  // The ranks sharing the host of `rank`, in group order: the group's number of each rank of
  // `local` (ShmTransportOptions::group_ranks).
  static std::vector<int> host_ranks_of(const std::vector<int>& host_of, int rank);

 private:
  Transport& link(int peer) { return is_local(peer) ? *local_ : *remote_; }
  int link_rank(int peer) const;
  void helper_loop();
  void run_on_helper(std::function<void()> job);
  void wait_for_helper();

  int rank_;
  std::vector<int> host_of_;
  std::unique_ptr<Transport> local_;
  std::unique_ptr<Transport> remote_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> job_;
  bool job_done_ = true;
  bool stopping_ = false;
  std::exception_ptr job_error_;
  std::thread helper_;
};

}  // namespace shardwise::collectives
