#include "collectives/tcp_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "collectives/transport_errors.h"

namespace shardwise::collectives {
namespace {

std::atomic<uint64_t>& sent_counter() {
  static std::atomic<uint64_t> bytes{0};
  return bytes;
}

constexpr size_t kHeaderBytes = 24;
constexpr size_t kStagingBytes = size_t{256} << 10;
constexpr size_t kLine = 64;

std::string system_error(const std::string& what) { return what + ": " + std::strerror(errno); }

sockaddr_in parse_address(const std::string& host, int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    addrinfo hints{}, *found = nullptr;
    hints.ai_family = AF_INET;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
      throw TransportError("cannot resolve host '" + host + "' to an IPv4 address");
    }
    address.sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
    ::freeaddrinfo(found);
  }
  return address;
}

void write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw TransportError(system_error("tcp handshake send"));
    p += n, bytes -= static_cast<size_t>(n);
  }
}

void tune(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

struct Header {
  uint64_t sequence;
  uint64_t bytes;
  uint32_t kind;
  uint32_t unused;
};
static_assert(sizeof(Header) == kHeaderBytes, "wire header is 24 bytes");

}  // namespace

std::string local_address_for(const std::string& host, const std::string& interface_name) {
  if (!interface_name.empty()) {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) throw TransportError(system_error("getifaddrs"));
    std::string found;
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr != nullptr && a->ifa_addr->sa_family == AF_INET &&
          interface_name == a->ifa_name) {
        char text[INET_ADDRSTRLEN];
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                    sizeof(text));
        found = text;
        break;
      }
    }
    ::freeifaddrs(list);
    if (found.empty()) {
      throw TransportError("network interface '" + interface_name +
                           "' (SHARDWISE_SOCKET_IFNAME) has no IPv4 address on this host");
    }
    return found;
  }
  if (host.empty()) return "127.0.0.1";
  const sockaddr_in target = parse_address(host, 9);
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t length = sizeof(local);
  const bool ok = fd >= 0 &&
                  ::connect(fd, reinterpret_cast<const sockaddr*>(&target), sizeof(target)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  if (fd >= 0) ::close(fd);
  if (!ok) throw TransportError(system_error("finding the interface that reaches " + host));
  char text[INET_ADDRSTRLEN];
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return text;
}

TcpTransport::TcpTransport(const TcpTransportOptions& options, const Rendezvous& rendezvous)
    : rank_(options.rank),
      size_(options.size),
      sockets_(options.size, -1),
      staging_(kStagingBytes) {
  if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
    throw std::invalid_argument("TcpTransport: rank " + std::to_string(rank_) + " is outside [0, " +
                                std::to_string(size_) + ")");
  }
  try {
    connect_mesh(options, rendezvous);
  } catch (...) {
    for (int fd : sockets_)
      if (fd >= 0) ::close(fd);
    throw;
  }
}

TcpTransport::~TcpTransport() {
  for (int fd : sockets_)
    if (fd >= 0) ::close(fd);
}

// Accepts until every higher rank has connected and named itself. A connection that sends no
// rank within `handshake_timeout`, or one that is not a missing higher rank, is closed and
// counted in `dropped`, which the timeout error reports.
void TcpTransport::accept_higher_ranks(int listener,
                                       Clock::time_point deadline,
                                       std::chrono::milliseconds handshake_timeout) {
  int missing = size_ - rank_ - 1;
  std::string dropped;
  while (missing > 0) {
    pollfd waiting{listener, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || ::poll(&waiting, 1, static_cast<int>(left.count())) <= 0) {
      throw TransportError("rank " + std::to_string(rank_) + ": Timed out waiting for " +
                           std::to_string(missing) + " higher rank(s) to connect" +
                           (dropped.empty() ? "" : "; dropped connections:" + dropped));
    }
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) continue;  // e.g. the connection was reset before it was accepted
    const auto wait = std::max<int64_t>(1, std::min(left, handshake_timeout).count());
    const timeval limit{static_cast<time_t>(wait / 1000),
                        static_cast<suseconds_t>(wait % 1000 * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    int32_t peer = -1;
    size_t got = 0;
    while (got < sizeof(peer)) {
      const ssize_t n = ::recv(fd, reinterpret_cast<char*>(&peer) + got, sizeof(peer) - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got < sizeof(peer) || peer <= rank_ || peer >= size_ || sockets_[peer] >= 0) {
      ::close(fd);
      if (dropped.size() < 400)
        dropped += got < sizeof(peer) ? " one that did not name its rank in time"
                                      : " one claiming rank " + std::to_string(peer);
      continue;
    }
    const timeval none{0, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
    sockets_[peer] = fd;
    --missing;
  }
}

void TcpTransport::connect_mesh(const TcpTransportOptions& options, const Rendezvous& rendezvous) {
  const Clock::time_point deadline = Clock::now() + options.connect_timeout;
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) throw TransportError(system_error("socket"));
  sockaddr_in address = parse_address(options.bind_address, 0);
  socklen_t length = sizeof(address);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(listener, size_) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(listener);
    throw TransportError(system_error("listening on " + options.bind_address));
  }
  rendezvous.set(options.key_prefix + "/" + std::to_string(rank_),
                 options.bind_address + ":" + std::to_string(ntohs(address.sin_port)));
  try {
    for (int peer = 0; peer < rank_; ++peer) {  // connect down
      const std::string where = rendezvous.get(options.key_prefix + "/" + std::to_string(peer));
      const size_t colon = where.rfind(':');
      const sockaddr_in target =
          parse_address(where.substr(0, colon), std::stoi(where.substr(colon + 1)));
      int fd = -1;
      while (true) {
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&target), sizeof(target)) == 0) break;
        ::close(fd);
        if (Clock::now() > deadline) {
          throw TransportError("rank " + std::to_string(rank_) + ": cannot connect to rank " +
                               std::to_string(peer) + " at " + where + ": " + std::strerror(errno));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      const int32_t me = rank_;
      write_all(fd, &me, sizeof(me));
      sockets_[peer] = fd;
    }
    accept_higher_ranks(listener, deadline, options.handshake_timeout);
  } catch (...) {
    ::close(listener);
    throw;
  }
  ::close(listener);
  for (int fd : sockets_)
    if (fd >= 0) tune(fd);
}

void TcpTransport::sendrecv(int send_peer,
                            ConstBuffer send,
                            int recv_peer,
                            size_t recv_bytes,
                            const RecvConsumer& consume,
                            Tag tag,
                            Clock::time_point deadline) {
  for (int peer : {send_peer, recv_peer}) {
    if (peer == rank_ || peer >= size_) {
      throw std::invalid_argument("TcpTransport::sendrecv: peer " + std::to_string(peer) +
                                  " is not another rank of this group of " + std::to_string(size_));
    }
  }
  const Header out_header{tag.sequence, send.bytes, tag.kind, 0};
  Header in_header{};
  size_t sent = 0, header_read = 0, payload_read = 0, delivered = 0, staged = 0;
  bool sending = send_peer >= 0, receiving = recv_peer >= 0;
  const int out_fd = sending ? sockets_[send_peer] : -1;
  const int in_fd = receiving ? sockets_[recv_peer] : -1;
  auto closed = [&](int peer) {
    return TransportError("rank " + std::to_string(rank_) + ": peer rank " + std::to_string(peer) +
                          " closed the connection (it exited or failed) during " + tag_text(tag));
  };
  while (sending || receiving) {
    pollfd fds[2];
    int count = 0;
    if (sending) fds[count++] = {out_fd, POLLOUT, 0};
    if (receiving) {
      if (count == 1 && out_fd == in_fd)
        fds[0].events |= POLLIN;
      else
        fds[count++] = {in_fd, POLLIN, 0};
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      throw TransportError(timeout_message(rank_, receiving ? recv_peer : send_peer,
                                           receiving ? recv_bytes : send.bytes, tag));
    }
    if (::poll(fds, count, static_cast<int>(std::min<int64_t>(left.count(), 100))) < 0 &&
        errno != EINTR) {
      throw TransportError(system_error("poll"));
    }
    for (int i = 0; i < count; ++i) {
      if (sending && fds[i].fd == out_fd && (fds[i].revents & (POLLOUT | POLLERR | POLLHUP))) {
        const bool in_header = sent < kHeaderBytes;
        const char* from = in_header ? reinterpret_cast<const char*>(&out_header) + sent
                                     : static_cast<const char*>(send.data) + (sent - kHeaderBytes);
        const size_t want = in_header ? kHeaderBytes - sent : send.bytes - (sent - kHeaderBytes);
        const ssize_t n = ::send(out_fd, from, want, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) throw closed(send_peer);
        if (n > 0) {
          sent += static_cast<size_t>(n);
          sent_counter().fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
        }
        sending = sent < kHeaderBytes + send.bytes;
      }
      if (receiving && fds[i].fd == in_fd && (fds[i].revents & (POLLIN | POLLERR | POLLHUP))) {
        char* into = header_read < kHeaderBytes ? reinterpret_cast<char*>(&in_header) + header_read
                                                : staging_.data() + staged;
        const size_t want = header_read < kHeaderBytes
                                ? kHeaderBytes - header_read
                                : std::min(staging_.size() - staged, recv_bytes - payload_read);
        const ssize_t n = want == 0 ? 0 : ::recv(in_fd, into, want, 0);
        if (want > 0 && n == 0) throw closed(recv_peer);
        if (n < 0 && errno != EAGAIN && errno != EINTR) throw closed(recv_peer);
        if (n <= 0) continue;
        if (header_read < kHeaderBytes) {
          header_read += static_cast<size_t>(n);
          if (header_read == kHeaderBytes) {
            check_header(rank_, recv_peer, tag, recv_bytes, Tag{in_header.sequence, in_header.kind},
                         in_header.bytes);
          }
        } else {
          payload_read += static_cast<size_t>(n);
          staged += static_cast<size_t>(n);
          const size_t ready = payload_read == recv_bytes ? staged : staged / kLine * kLine;
          if (ready > 0) {
            consume(delivered, staging_.data(), ready);
            delivered += ready;
            std::memmove(staging_.data(), staging_.data() + ready, staged - ready);
            staged -= ready;
          }
        }
        receiving = header_read < kHeaderBytes || delivered < recv_bytes;
      }
    }
  }
}

uint64_t TcpTransport::bytes_sent() { return sent_counter().load(std::memory_order_relaxed); }

bool TcpTransport::message_waiting(int peer) {
  char byte;  // a byte to peek at: readable end-of-file (the peer closed) is no message
  return ::recv(sockets_.at(peer), &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 1;
}

void TcpTransport::abort(const std::string& /*reason*/) {
  for (int fd : sockets_)
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

}  // namespace shardwise::collectives
