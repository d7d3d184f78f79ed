#include "collectives/inprocess_transport.h"

#include <string>

#include "collectives/transport_errors.h"

namespace shardwise::collectives {

InProcessHub::InProcessHub(int size) : size_(size), channels_(static_cast<size_t>(size) * size) {
  if (size < 1) {
    throw std::invalid_argument("InProcessHub: size must be >= 1, got " + std::to_string(size));
  }
}

InProcessTransport::InProcessTransport(std::shared_ptr<InProcessHub> hub, int rank)
    : hub_(std::move(hub)), rank_(rank) {
  if (rank < 0 || rank >= hub_->size()) {
    throw std::invalid_argument("InProcessTransport: rank " + std::to_string(rank) +
                                " is outside [0, " + std::to_string(hub_->size()) + ")");
  }
}

void InProcessTransport::sendrecv(int send_peer,
                                  ConstBuffer send,
                                  int recv_peer,
                                  size_t recv_bytes,
                                  const RecvConsumer& consume,
                                  Tag tag,
                                  Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(hub_->mutex_);
  if (send_peer >= 0) {  // enqueue first: the peer may be waiting for it
    const char* bytes = static_cast<const char*>(send.data);
    hub_->channel(rank_, send_peer).push_back({tag, std::vector<char>(bytes, bytes + send.bytes)});
    hub_->arrived_.notify_all();
  }
  if (recv_peer < 0) {
    return;
  }
  std::deque<InProcessHub::Message>& in = hub_->channel(recv_peer, rank_);
  const bool arrived = hub_->arrived_.wait_until(
      lock, deadline, [&] { return !in.empty() || !hub_->failure_.empty(); });
  if (!hub_->failure_.empty()) {
    throw TransportError("rank " + std::to_string(rank_) + ": group failed: " + hub_->failure_);
  }
  if (!arrived) {
    throw TransportError(timeout_message(rank_, recv_peer, recv_bytes, tag));
  }
  InProcessHub::Message message = std::move(in.front());
  in.pop_front();
  check_header(rank_, recv_peer, tag, recv_bytes, message.tag, message.bytes.size());
  lock.unlock();
  if (recv_bytes > 0) {
    consume(0, message.bytes.data(), recv_bytes);
  }
}

bool InProcessTransport::message_waiting(int peer) {
  std::lock_guard<std::mutex> lock(hub_->mutex_);
  return !hub_->channel(peer, rank_).empty() || !hub_->failure_.empty();
}

void InProcessTransport::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(hub_->mutex_);
  if (hub_->failure_.empty()) {
    hub_->failure_ = "rank " + std::to_string(rank_) + " aborted: " + reason;
  }
  hub_->arrived_.notify_all();
}

}  // namespace shardwise::collectives
