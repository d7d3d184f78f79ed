// A Transport between threads of one process: every (source, destination) pair of ranks has a
// FIFO of tagged messages guarded by one mutex and condition variable. Sends never block (the
// FIFO grows), so sendrecv cannot deadlock. Used by the GoogleTest suites, where threads are ranks.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/transport.h"

namespace shardwise::collectives {

// The shared state of one in-process group; create one, then one transport per rank.
class InProcessHub {
 public:
  explicit InProcessHub(int size);
  int size() const { return size_; }

 private:
  friend class InProcessTransport;
  struct Message {
    Tag tag;
    std::vector<char> bytes;
  };
  std::deque<Message>& channel(int source, int destination) {
    return channels_[source * size_ + destination];
  }

  int size_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::vector<std::deque<Message>> channels_;
  std::string failure_;  // set by abort()
};

class InProcessTransport : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessHub> hub, int rank);
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
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

 private:
  std::shared_ptr<InProcessHub> hub_;
  int rank_;
};

}  // namespace shardwise::collectives
