#include "collectives/transport.h"

#include <cstring>

namespace shardwise::collectives {

RecvConsumer copy_into(void* destination) {
  char* out = static_cast<char*>(destination);
  return [out](size_t offset, const void* data, size_t bytes) {
    std::memcpy(out + offset, data, bytes);
  };
}

void Transport::sendrecv(int send_peer,
                         ConstBuffer send,
                         int recv_peer,
                         Buffer recv,
                         Tag tag,
                         Clock::time_point deadline) {
  sendrecv(send_peer, send, recv_peer, recv.bytes, copy_into(recv.data), tag, deadline);
}

std::vector<int> Transport::host_of() const { return {}; }

bool Transport::message_waiting(int /*peer*/) {
  throw std::logic_error(
      "this transport cannot tell which peer sent first (no receive from any source)");
}

}  // namespace shardwise::collectives
