// A plain TCP client for tests that play a peer by hand (tests/cpp/test_tcp_transport.cc,
// tests/fuzz/fuzz_tcp_frames.cc): connects to the "address:port" a TcpTransport publishes.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

namespace shardwise::collectives::testing {

// The connected socket, or -1 when the connection fails.
inline int connect_to(const std::string& where) {
  const size_t colon = where.rfind(':');
  sockaddr_in target{};
  target.sin_family = AF_INET;
  target.sin_port = htons(static_cast<uint16_t>(std::stoi(where.substr(colon + 1))));
  ::inet_pton(AF_INET, where.substr(0, colon).c_str(), &target.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&target), sizeof(target)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Closes `fd` with a reset instead of a FIN, so the port is not held in TIME_WAIT: a harness that
// opens tens of thousands of loopback connections a minute would otherwise run out of ephemeral
// ports (connect fails with EADDRNOTAVAIL).
inline void close_abortively(int fd) {
  const linger abort_on_close{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close));
  ::close(fd);
}

}  // namespace shardwise::collectives::testing
