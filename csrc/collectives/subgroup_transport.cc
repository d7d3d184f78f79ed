#include "collectives/subgroup_transport.h"

#include <algorithm>
#include <stdexcept>

namespace shardwise::collectives {

SubgroupTransport::SubgroupTransport(Transport& parent, std::vector<int> members)
    : parent_(parent), members_(std::move(members)) {
  for (size_t i = 0; i < members_.size(); ++i) {
    if (members_[i] < 0 || members_[i] >= parent_.size()) {
      throw std::invalid_argument("SubgroupTransport: member " + std::to_string(members_[i]) +
                                  " is not a rank of the parent group of " +
                                  std::to_string(parent_.size()));
    }
    if (members_[i] == parent_.rank()) rank_ = static_cast<int>(i);
  }
  if (rank_ < 0) {
    throw std::invalid_argument("SubgroupTransport: the parent's rank " +
                                std::to_string(parent_.rank()) + " is not among the members");
  }
}

int SubgroupTransport::parent_rank(int peer) const {
  if (peer < 0) return -1;
  if (peer >= size()) {
    throw std::invalid_argument("SubgroupTransport: peer " + std::to_string(peer) +
                                " is outside the subgroup of " + std::to_string(size()));
  }
  return members_[peer];
}

void SubgroupTransport::sendrecv(int send_peer,
                                 ConstBuffer send,
                                 int recv_peer,
                                 size_t recv_bytes,
                                 const RecvConsumer& consume,
                                 Tag tag,
                                 Clock::time_point deadline) {
  parent_.sendrecv(parent_rank(send_peer), send, parent_rank(recv_peer), recv_bytes, consume, tag,
                   deadline);
}

void SubgroupTransport::sendrecv(int send_peer,
                                 ConstBuffer send,
                                 int recv_peer,
                                 Buffer recv,
                                 Tag tag,
                                 Clock::time_point deadline) {
  parent_.sendrecv(parent_rank(send_peer), send, parent_rank(recv_peer), recv, tag, deadline);
}

std::vector<int> SubgroupTransport::host_of() const {
  const std::vector<int> hosts = parent_.host_of();
  if (hosts.empty()) return {};
  std::vector<int> mine(members_.size());
  std::transform(members_.begin(), members_.end(), mine.begin(), [&](int r) { return hosts[r]; });
  return mine;
}

}  // namespace shardwise::collectives
