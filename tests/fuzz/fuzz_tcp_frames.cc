// libFuzzer target: what a TCP peer sends (collectives/tcp_transport.h). Rank 0 is a real
// TcpTransport; rank 1 is this harness, which completes the handshake, writes the fuzzed bytes
// (headers with any sequence, kind and length, truncated headers, short or long payloads) and
// closes. Rank 0's receive must deliver exactly the expected message in order, or throw
// TransportError (mismatch, closed connection, deadline): never crash, overrun its staging
// buffer or hang.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "../cpp/tcp_client.h"
#include "collectives/tcp_transport.h"

using namespace shardwise::collectives;

namespace {

void write_all(int fd, const uint8_t* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::send(fd, data, bytes, MSG_NOSIGNAL);
    if (n <= 0) return;  // rank 0 may already have closed
    data += n, bytes -= static_cast<size_t>(n);
  }
}

// Connects to "address:port" as rank 1 (retrying for a second: a connect can fail for want of
// a local port, which is the machine's state, not the transport's), then writes `stream` and
// half-closes. A harness that cannot connect at all says why and stops.
int impersonate_rank1(const std::string& where, const uint8_t* stream, size_t bytes) {
  int fd = testing::connect_to(where);
  for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    fd = testing::connect_to(where);
  }
  if (fd < 0) {
    std::fprintf(stderr, "fuzz_tcp_frames harness: cannot connect to %s: %s\n", where.c_str(),
                 std::strerror(errno));
    abort();
  }
  const int32_t me = 1;
  write_all(fd, reinterpret_cast<const uint8_t*>(&me), sizeof(me));
  write_all(fd, stream, bytes);
  ::shutdown(fd, SHUT_WR);
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t recv_bytes = (data[0] | (data[1] & 0x0f) << 8);  // 0 .. 4095
  const Tag expected = make_tag(Kind::kAllreduce, 7);
  int peer_fd = -1;
  Rendezvous rendezvous;
  rendezvous.set = [&](const std::string&, const std::string& where) {
    peer_fd = impersonate_rank1(where, data + 2, size - 2);
  };
  rendezvous.get = [](const std::string&) -> std::string { abort(); };
  TcpTransportOptions options;
  options.rank = 0;
  options.size = 2;
  options.connect_timeout = std::chrono::seconds(5);
  TcpTransport transport(options, rendezvous);
  size_t next = 0;
  const auto consume = [&](size_t offset, const void*, size_t bytes) {
    if (offset != next || offset + bytes > recv_bytes) __builtin_trap();  // out of order or past
    next += bytes;
  };
  try {
    transport.sendrecv(-1, {}, 1, recv_bytes, consume, expected,
                       Clock::now() + std::chrono::seconds(5));
    if (next != recv_bytes) __builtin_trap();  // returned without the whole message
  } catch (const TransportError&) {
  }
  if (peer_fd >= 0) testing::close_abortively(peer_fd);  // no TIME_WAIT: see tcp_client.h
  return 0;
}
