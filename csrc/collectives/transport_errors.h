// Error texts shared by the transports, so every failure names this rank, the peer, the bytes
// and the message tag in the same words.
#pragma once

#include <cstddef>
#include <string>

#include "collectives/transport.h"

namespace shardwise::collectives {

inline std::string tag_text(Tag tag) {
  return std::string(kind_name(tag.kind)) + " #" + std::to_string(tag.sequence);
}

inline std::string timeout_message(int rank, int peer, size_t bytes, Tag tag) {
  return "rank " + std::to_string(rank) + ": Timed out waiting for rank " + std::to_string(peer) +
         " in " + tag_text(tag) + " (" + std::to_string(bytes) + " bytes)";
}

// Throws TransportError when a received message header differs from the expected one.
inline void check_header(
    int rank, int peer, Tag expected, size_t expected_bytes, Tag got, size_t got_bytes) {
  if (got.sequence != expected.sequence || got.kind != expected.kind ||
      got_bytes != expected_bytes) {
    throw TransportError("rank " + std::to_string(rank) + ": mismatched collectives: expected " +
                         tag_text(expected) + " with " + std::to_string(expected_bytes) +
                         " bytes from rank " + std::to_string(peer) + ", but rank " +
                         std::to_string(peer) + " sent " + tag_text(got) + " with " +
                         std::to_string(got_bytes) + " bytes");
  }
}

}  // namespace shardwise::collectives
