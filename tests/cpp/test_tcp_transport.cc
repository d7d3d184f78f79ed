// The TCP transport's handshake against connections that are not ranks of the group: a port
// scanner or another job's stray connection must neither stall nor end the mesh's forming, and a
// mesh that cannot form says what it dropped. (Frames from a hostile peer are fuzzed by
// tests/fuzz/fuzz_tcp_frames.cc.)
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/tcp_transport.h"
#include "collectives_harness.h"
#include "tcp_client.h"

namespace shardwise::collectives {
namespace {

// Connects to "address:port" and sends `bytes` (nothing when empty); returns the socket.
int stranger(const std::string& where, const std::string& bytes) {
  const int fd = testing::connect_to(where);
  EXPECT_GE(fd, 0);
  if (!bytes.empty()) EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), bytes.size());
  return fd;
}

TcpTransportOptions options_for(int rank, int size) {
  TcpTransportOptions options;
  options.rank = rank;
  options.size = size;
  options.connect_timeout = std::chrono::seconds(20);
  options.handshake_timeout = std::chrono::milliseconds(300);
  return options;
}

TEST(TcpTransport, StrangersConnectingFirstAreDroppedAndTheMeshForms) {
  testing::MemoryRendezvous store;
  std::vector<int> strangers;
  Rendezvous rendezvous = store.view();
  const auto publish = rendezvous.set;
  rendezvous.set = [&](const std::string& key, const std::string& where) {
    if (key == "tcp/0") {  // before rank 1 can learn the address: an HTTP probe, a silent one
      strangers.push_back(stranger(where, "GET / HTTP/1.1\r\n\r\n"));
      strangers.push_back(stranger(where, ""));
      strangers.push_back(stranger(where, std::string("\x01\x00\x00", 3)));  // a short claim
    }
    publish(key, where);
  };
  float sums[2] = {1.0f, 2.0f};
  std::thread rank1([&] {
    TcpTransport t(options_for(1, 2), store.view());
    allreduce(t, &sums[1], 1, {});
  });
  TcpTransport t(options_for(0, 2), rendezvous);
  allreduce(t, &sums[0], 1, {});
  rank1.join();
  EXPECT_EQ(sums[0], 3.0f);
  EXPECT_EQ(sums[1], 3.0f);
  for (int fd : strangers) ::close(fd);
}

// What the ZeRO++ measurements read as inter-host bytes (shardwise._C.tcp_bytes_sent). Catches
// the counter missing a message or counting one received: two ranks in this process exchanging
// 4000 bytes each way add exactly their two messages, 24-byte headers included, and a message
// only received (the peer's half is -1) adds the sender's alone.
TEST(TcpTransport, BytesSentCountsEveryMessageSentOnce) {
  testing::MemoryRendezvous store;
  std::vector<float> out0(1000, 1.0f), out1(1000, 2.0f), in0(1000), in1(1000);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  const Tag tag = make_tag(Kind::kSendRecv, 1);
  const uint64_t before = TcpTransport::bytes_sent();  // forming the mesh sends no message
  std::thread rank1([&] {
    TcpTransport t(options_for(1, 2), store.view());
    t.sendrecv(0, ConstBuffer{out1.data(), 4000}, 0, Buffer{in1.data(), 4000}, tag, deadline);
    t.sendrecv(0, ConstBuffer{out1.data(), 400}, -1, Buffer{}, tag, deadline);
  });
  TcpTransport t(options_for(0, 2), store.view());
  t.sendrecv(1, ConstBuffer{out0.data(), 4000}, 1, Buffer{in0.data(), 4000}, tag, deadline);
  t.sendrecv(-1, ConstBuffer{}, 1, Buffer{in0.data(), 400}, tag, deadline);
  rank1.join();
  EXPECT_EQ(TcpTransport::bytes_sent() - before, 2 * (24 + 4000) + (24 + 400));
  EXPECT_EQ(in0[0], 2.0f);
  EXPECT_EQ(in1[999], 1.0f);
}

TEST(TcpTransport, AMeshThatCannotFormTimesOutNamingWhatItDropped) {
  testing::MemoryRendezvous store;
  Rendezvous rendezvous = store.view();
  int fd = -1;
  rendezvous.set = [&](const std::string&, const std::string& where) {
    const int32_t claim = 5;  // not a rank of this group of 2
    fd = stranger(where, std::string(reinterpret_cast<const char*>(&claim), sizeof(claim)));
  };
  TcpTransportOptions options = options_for(0, 2);
  options.connect_timeout = std::chrono::milliseconds(800);
  try {
    TcpTransport t(options, rendezvous);
    ADD_FAILURE() << "formed a mesh without rank 1";
  } catch (const TransportError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("rank 0: Timed out waiting for 1 higher rank(s) to connect"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("one claiming rank 5"), std::string::npos) << text;
  }
  ::close(fd);
}

}  // namespace
}  // namespace shardwise::collectives
