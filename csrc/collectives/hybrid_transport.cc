#include "collectives/hybrid_transport.h"

#include <stdexcept>
#include <string>

namespace shardwise::collectives {

int HybridTransport::local_rank_of(const std::vector<int>& host_of, int rank) {
  int position = 0;
  for (int r = 0; r < rank; ++r) position += host_of[r] == host_of[rank] ? 1 : 0;
  return position;
}

int HybridTransport::local_size_of(const std::vector<int>& host_of, int rank) {
  int count = 0;
  for (int host : host_of) count += host == host_of[rank] ? 1 : 0;
  return count;
}

std::vector<int> HybridTransport::host_ranks_of(const std::vector<int>& host_of, int rank) {
  std::vector<int> ranks;
  for (int r = 0; r < static_cast<int>(host_of.size()); ++r)
    if (host_of[r] == host_of[rank]) ranks.push_back(r);
  return ranks;
}

HybridTransport::HybridTransport(const HybridTransportOptions& options,
                                 std::unique_ptr<Transport> local,
                                 std::unique_ptr<Transport> remote)
    : rank_(options.rank),
      host_of_(options.host_of),
      local_(std::move(local)),
      remote_(std::move(remote)) {
  const int size = static_cast<int>(host_of_.size());
  if (rank_ < 0 || rank_ >= size) {
    throw std::invalid_argument("HybridTransport: rank " + std::to_string(rank_) +
                                " is outside host_of (size " + std::to_string(size) + ")");
  }
  if (!local_ || local_->size() != local_size_of(host_of_, rank_) ||
      local_->rank() != local_rank_of(host_of_, rank_)) {
    throw std::invalid_argument("HybridTransport: `local` must connect the " +
                                std::to_string(local_size_of(host_of_, rank_)) +
                                " ranks of this host, with this rank as local rank " +
                                std::to_string(local_rank_of(host_of_, rank_)));
  }
  if (!remote_ || remote_->size() != size || remote_->rank() != rank_) {
    throw std::invalid_argument("HybridTransport: `remote` must connect all " +
                                std::to_string(size) + " ranks, with this rank as rank " +
                                std::to_string(rank_));
  }
  helper_ = std::thread([this] { helper_loop(); });
}

HybridTransport::~HybridTransport() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  helper_.join();
}

int HybridTransport::link_rank(int peer) const {
  if (peer < 0) return -1;
  return host_of_[peer] == host_of_[rank_] ? local_rank_of(host_of_, peer) : peer;
}

void HybridTransport::helper_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !job_done_; });
    if (stopping_) return;
    std::function<void()> job = std::move(job_);
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    job_error_ = error;
    job_done_ = true;
    changed_.notify_all();
  }
}

void HybridTransport::run_on_helper(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = std::move(job);
    job_error_ = nullptr;
    job_done_ = false;
  }
  changed_.notify_all();
}

void HybridTransport::wait_for_helper() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return job_done_; });
  if (job_error_) std::rethrow_exception(job_error_);
}

void HybridTransport::sendrecv(int send_peer,
                               ConstBuffer send,
                               int recv_peer,
                               size_t recv_bytes,
                               const RecvConsumer& consume,
                               Tag tag,
                               Clock::time_point deadline) {
  for (int peer : {send_peer, recv_peer}) {
    if (peer == rank_ || peer >= size()) {
      throw std::invalid_argument("HybridTransport::sendrecv: peer " + std::to_string(peer) +
                                  " is not another rank of this group of " +
                                  std::to_string(size()));
    }
  }
  const bool split = send_peer >= 0 && recv_peer >= 0 && is_local(send_peer) != is_local(recv_peer);
  if (!split) {
    Transport& through = link(send_peer >= 0 ? send_peer : recv_peer >= 0 ? recv_peer : rank_);
    through.sendrecv(link_rank(send_peer), send, link_rank(recv_peer), recv_bytes, consume, tag,
                     deadline);
    return;
  }
  Transport& send_link = link(send_peer);
  const int send_rank = link_rank(send_peer);
  run_on_helper([&send_link, send_rank, send, tag, deadline] {
    send_link.sendrecv(send_rank, send, -1, 0, RecvConsumer(), tag, deadline);
  });
  try {
    link(recv_peer).sendrecv(-1, ConstBuffer{}, link_rank(recv_peer), recv_bytes, consume, tag,
                             deadline);
  } catch (const std::exception& error) {
    abort(error.what());  // unblocks the send half, whose own error is then secondary
    try {
      wait_for_helper();
    } catch (...) {
    }
    throw;
  }
  wait_for_helper();
}

bool HybridTransport::message_waiting(int peer) {
  return (is_local(peer) ? *local_ : *remote_).message_waiting(link_rank(peer));
}

void HybridTransport::abort(const std::string& reason) {
  local_->abort(reason);
  remote_->abort(reason);
}

}  // namespace shardwise::collectives
