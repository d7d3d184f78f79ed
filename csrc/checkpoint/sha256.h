// SHA-256 (FIPS 180-4), torch-free: the digest shardwise-train's checkpoint manifests record for
// every rank file, so a checkpoint written by the C++ trainer verifies in Python (hashlib) and
// the other way round. Streaming: update() any number of times, then hex().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace shardwise::checkpoint {

class Sha256 {
 public:
  // `hardware`: the x86 SHA extensions where the CPU has them (sha256_x86.h), else the portable
  // loop; both give the same digest.
  explicit Sha256(bool hardware = true);
  void update(const void* data, size_t size);
  std::string hex();  // the digest as 64 lowercase hex digits; ends the hash

 private:
  void compress(const uint8_t* block);  // one 64-byte block into state_
  void compress_blocks(const uint8_t* data, size_t blocks);
  bool hardware_ = false;
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes hashed so far
};

// The SHA-256 of a file's bytes, read in blocks; throws std::runtime_error naming the path when
// it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace shardwise::checkpoint
