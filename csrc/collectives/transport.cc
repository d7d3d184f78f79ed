#include "collectives/transport.h"

#include <cstring>

namespace shardwise::collectives {

void Transport::sendrecv(int send_peer,
                         ConstBuffer send,
                         int recv_peer,
                         Buffer recv,
                         Tag tag,
                         Clock::time_point deadline) {
  char* out = static_cast<char*>(recv.data);
  sendrecv(
      send_peer, send, recv_peer, recv.bytes,
      [out](size_t offset, const void* data, size_t bytes) {
        std::memcpy(out + offset, data, bytes);
      },
      tag, deadline);
}

}  // namespace shardwise::collectives
