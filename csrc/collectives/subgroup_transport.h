// A Transport over some of another transport's ranks: the hierarchical collectives' view of
// "my host's ranks" or "the ranks with my place on every host".
//
// `members` lists the parent's ranks that form the subgroup, in subgroup order; member i is
// subgroup rank i, and the parent's own rank must be one of them. sendrecv maps subgroup peers to
// the parent's ranks and forwards the call, so messages keep the parent's links (shared memory
// within a host, TCP across), its tags and its deadlines. Nothing is owned: the view must not
// outlive `parent`.
#pragma once

#include <string>
#include <vector>

#include "collectives/transport.h"

namespace shardwise::collectives {

class SubgroupTransport : public Transport {
 public:
  SubgroupTransport(Transport& parent, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  using Transport::sendrecv;
  void sendrecv(int send_peer,
                ConstBuffer send,
                int recv_peer,
                size_t recv_bytes,
                const RecvConsumer& consume,
                Tag tag,
                Clock::time_point deadline) override;
  void sendrecv(int send_peer,
                ConstBuffer send,
                int recv_peer,
                Buffer recv,
                Tag tag,
                Clock::time_point deadline) override;
  void abort(const std::string& reason) override { parent_.abort(reason); }
  bool message_waiting(int peer) override { return parent_.message_waiting(parent_rank(peer)); }
  std::vector<int> host_of() const override;

 private:
  int parent_rank(int peer) const;

  Transport& parent_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace shardwise::collectives
