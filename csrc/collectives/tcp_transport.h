// A Transport over TCP, for ranks on different hosts: a full mesh of connections, bootstrapped
// through a key-value rendezvous (the c10d Store in the backend).
//
// Set-up: every rank listens on `bind_address` (port chosen by the kernel), publishes
// "address:port" under "tcp/<rank>", connects to every lower rank (sending its own rank as the
// first 4 bytes) and accepts one connection from every higher rank; a connection that does not
// name a missing higher rank in time is dropped, not fatal. Sockets use TCP_NODELAY.
//
// Messages are a 24-byte header (sequence, kind, payload bytes) and the payload. sendrecv polls
// the send socket for writability and the receive socket for readability together, so both
// halves progress at once; received bytes pass through a staging buffer and are handed to the
// consumer in pieces that are multiples of 64 bytes (bar the last). A peer that exits closes its
// sockets, which surfaces at once as end-of-file; `abort` shuts every socket down so peers learn
// of a failure just as fast.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collectives/transport.h"

namespace shardwise::collectives {

// Where ranks publish and look up each other's addresses; `get` blocks until the key exists.
struct Rendezvous {
  std::function<void(const std::string& key, const std::string& value)> set;
  std::function<std::string(const std::string& key)> get;
};

struct TcpTransportOptions {
  int rank = 0;
  int size = 1;
  std::string bind_address = "127.0.0.1";  // an IPv4 address of this host's chosen interface
  std::string key_prefix = "tcp";
  std::chrono::milliseconds connect_timeout = std::chrono::minutes(5);
  // How long an accepted connection has to name its rank; one that does not, or names no
  // missing rank (a port scanner, another job), is closed and the wait goes on.
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(10);
};

class TcpTransport : public Transport {
 public:
  TcpTransport(const TcpTransportOptions& options, const Rendezvous& rendezvous);
  ~TcpTransport() override;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
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

  // Bytes this process has sent over every TcpTransport since it started, headers included:
  // with the hybrid transport, what it sent to ranks on other hosts.
  static uint64_t bytes_sent();

 private:
  void connect_mesh(const TcpTransportOptions& options, const Rendezvous& rendezvous);
  void accept_higher_ranks(int listener,
                           Clock::time_point deadline,
                           std::chrono::milliseconds handshake_timeout);

  int rank_;
  int size_;
  std::vector<int> sockets_;  // by peer rank; -1 for this rank
  std::vector<char> staging_;
};

// The IPv4 address of the local interface that routes to `host` (no packet is sent), or of the
// interface named `interface_name` when that is not empty.
std::string local_address_for(const std::string& host, const std::string& interface_name);

}  // namespace shardwise::collectives
