// The torch-free parts of shardwise-train's checkpoint format: SHA-256 against FIPS 180-4's
// examples, the JSON reader on what Python's json module writes, the manifest round trip, and
// the folder rules (a torn or corrupt newer checkpoint is skipped with its reason, pruning keeps
// the newest complete ones). tests/python/test_checkpoint_cpp.py checks the same files against
// Python's own reader.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/atomic_file.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/resume_agreement.h"
#include "checkpoint/sha256.h"
#include "checkpoint/sha256_x86.h"
#include "common/json.h"

namespace shardwise::checkpoint {
namespace {
namespace fs = std::filesystem;

std::string hash(const std::string& text) {
  Sha256 h;
  h.update(text.data(), text.size());
  return h.hex();
}

TEST(Sha256, MatchesTheStandardsExamples) {
  EXPECT_EQ(hash(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hash("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // A million 'a's fed in uneven pieces: the buffering across updates.
  Sha256 h;
  const std::string piece(997, 'a');
  int64_t left = 1000000;
  while (left > 0) {
    const auto n = static_cast<size_t>(std::min<int64_t>(left, piece.size()));
    h.update(piece.data(), n);
    left -= static_cast<int64_t>(n);
  }
  EXPECT_EQ(h.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, TheSHAExtensionsGiveThePortableDigest) {
  // lengths around the 64-byte block and the 56-byte padding boundary, and many blocks, fed
  // whole and in uneven pieces (buffered and straight-from-input blocks mixed)
  std::string data(100003, '\0');
  uint32_t x = 12345;
  for (char& c : data) c = static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);
  for (size_t length : {0, 1, 55, 56, 63, 64, 65, 119, 128, 1000, 65536, 100003}) {
    Sha256 hardware(true), portable(false), pieces(true);
    hardware.update(data.data(), length);
    portable.update(data.data(), length);
    for (size_t at = 0; at < length; at += 97)
      pieces.update(data.data() + at, std::min<size_t>(97, length - at));
    const std::string expected = portable.hex();
    EXPECT_EQ(hardware.hex(), expected) << length;
    EXPECT_EQ(pieces.hex(), expected) << length;
  }
  if (!sha256_extensions_available()) GTEST_SKIP() << "no SHA extensions: one path tested";
}

TEST(Json, ReadsWhatPythonWrites) {
  const auto v = json::parse(
      R"({"a": [1, -2.5e3, true, false, null], "s": "x\"\\\n\u00e9\ud83d\ude00", "n": {}})");
  EXPECT_EQ(v.at("a").array.size(), 5u);
  EXPECT_EQ(v.at("a").array[0].as_integer(), 1);
  EXPECT_DOUBLE_EQ(v.at("a").array[1].number, -2500.0);
  EXPECT_FALSE(v.at("a").array[1].is_integer);
  EXPECT_TRUE(v.at("a").array[2].boolean);
  EXPECT_EQ(v.at("a").array[3].kind, json::Value::Kind::kBool);
  EXPECT_FALSE(v.at("a").array[3].boolean);
  EXPECT_EQ(v.at("a").array[4].kind, json::Value::Kind::kNull);
  EXPECT_EQ(v.at("s").as_string(), "x\"\\\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v.at("n").object.empty());
  EXPECT_EQ(json::parse(json::quote("a\"b\\c\n\x01")).as_string(), "a\"b\\c\n\x01");
}

TEST(Json, MalformedTextIsAnErrorNamingTheByte) {
  for (const char* bad : {"{", "[1,]", "{\"a\" 1}", "\"\\ud800\"", "tru", "1 2", "\"\x01\""}) {
    EXPECT_THROW(json::parse(bad), std::invalid_argument) << bad;
  }
  try {
    json::parse("[1, x]");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("at byte 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(json::parse("{}").at("missing", "manifest"), std::invalid_argument);
}

class CheckpointDir : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("shardwise-ckpt-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A complete checkpoint of `world` ranks at `step` (rank files hold `text`).
  std::string save(int64_t step, int world, const std::string& text = "payload") {
    const fs::path dir = root_ / step_dir_name(step);
    fs::create_directories(dir);
    for (int r = 0; r < world; ++r) {
      atomic_write((dir / rank_file_name(r)).string(), text + std::to_string(r), "test");
    }
    write_manifest(dir.string(), step, world, "model:\n  dim: 64\n");
    return dir.string();
  }

  fs::path root_;
};

TEST_F(CheckpointDir, TheManifestRoundTripsAndRecordsEveryRankFile) {
  EXPECT_EQ(step_dir_name(100), "step-00000100");
  EXPECT_EQ(rank_file_name(3), "rank-00003.pt");
  const std::string dir = save(5, 2);
  std::ifstream in(fs::path(dir) / kManifest);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Manifest m = parse_manifest(text, "manifest");
  EXPECT_EQ(m.step, 5);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.config_yaml, "model:\n  dim: 64\n");
  ASSERT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.files.at("rank-00001.pt").size, 8);
  EXPECT_EQ(m.files.at("rank-00001.pt").sha256, hash("payload1"));
  EXPECT_EQ(manifest_json(m), text);
  EXPECT_EQ(verify(dir), "");
}

TEST_F(CheckpointDir, LatestSkipsTornAndCorruptCheckpointsWithTheirReasons) {
  save(1, 2);
  const std::string corrupt = save(2, 2);
  const std::string torn = save(3, 2);
  // Corrupt at the same size, then a crash before the manifest.
  std::ofstream(fs::path(corrupt) / "rank-00001.pt") << "payloaX1";
  fs::remove(fs::path(torn) / kManifest);
  std::vector<std::string> skipped;
  const auto found = latest(root_.string(), &skipped);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->manifest.step, 1);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find("incomplete checkpoint"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[1].find("SHA-256 mismatch"), std::string::npos) << skipped[1];
  {
    std::ofstream(fs::path(found->path) / "rank-00000.pt") << "pay";
  }
  EXPECT_NE(verify(found->path).find("truncated"), std::string::npos);
  EXPECT_FALSE(latest(root_.string()).has_value());
  EXPECT_THROW(write_manifest((root_ / "step-00000009").string(), 9, 1, ""), std::runtime_error);
}

// Hostile manifests (tests/fuzz/fuzz_checkpoint_manifest; its regressions/ hold the inputs): a
// world size of 0 made a folder with no rank file "complete", and a huge one looped billions of
// times before any file was looked at. A manifest moved to another step's folder is refused.
TEST_F(CheckpointDir, HostileManifestsAreRefusedBeforeAnyFileIsRead) {
  auto refused = [](const std::string& text, const std::string& reason) {
    try {
      parse_manifest(text, "manifest.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  };
  const std::string file = R"("rank-00000.pt": {"size": 1, "sha256": ")" + hash("x") + "\"}";
  refused(R"({"files": {}, "format": 1, "step": 1, "world_size": 0})", "world_size 0 but 0");
  refused(R"({"files": {}, "format": 1, "step": 1, "world_size": 2000000000})",
          "world_size 2000000000 but 0 files");
  refused(R"({"files": {)" + file + R"(}, "format": 2, "step": 1, "world_size": 1})", "format 2");
  refused(R"({"files": {)" + file + R"(}, "format": 1, "step": -4, "world_size": 1})", "step -4");
  refused(R"({"files": {"rank-00000.pt": {"size": -1, "sha256": "00"}}, "format": 1, "step": 1,
             "world_size": 1})",
          "size must be >= 0 and sha256 64 hex digits");
  const std::string dir = save(7, 1);
  fs::rename(dir, root_ / step_dir_name(8));
  EXPECT_NE(verify((root_ / step_dir_name(8)).string()).find("is for step 7, not the folder's"),
            std::string::npos);
}

TEST_F(CheckpointDir, PruneKeepsTheNewestCompleteOnesAndNothingNewerIsTouched) {
  for (int step : {1, 2, 3, 4}) save(step, 1);
  fs::create_directories(root_ / step_dir_name(5));  // newer than the one just saved: untouched
  fs::remove(root_ / step_dir_name(3) / kManifest);  // incomplete: removed, not counted
  const auto deleted = prune(root_.string(), 2, 4);
  EXPECT_EQ(deleted.size(), 2u);  // step 3 (incomplete) and step 1
  EXPECT_TRUE(fs::exists(root_ / step_dir_name(2)));
  EXPECT_TRUE(fs::exists(root_ / step_dir_name(4)));
  EXPECT_TRUE(fs::exists(root_ / step_dir_name(5)));
  EXPECT_FALSE(fs::exists(root_ / step_dir_name(1)));
  EXPECT_FALSE(fs::exists(root_ / step_dir_name(3)));
  EXPECT_THROW(prune(root_.string(), 0, 4), std::invalid_argument);
}

// The resume race the fault soak found: a fast rank that resumed at the newest step saved again
// at once, rewriting its rank file while a slower rank still verified that folder; the slower
// rank skipped it and resumed from an older one. Here rank 0 chooses, then (as the fast rank did)
// rewrites a rank file of the newest checkpoint before the others start, so a rank that looked
// for itself would choose step 10; each must still take rank 0's step 20.
TEST_F(CheckpointDir, EveryRankResumesFromTheCheckpointRankZeroChose) {
  save(10, 3);
  const std::string newest = save(20, 3);
  std::ofstream(fs::path(newest) / ".rank-00001.pt.x1y2.tmp") << "a killed write";
  std::promise<int64_t> chosen;
  std::shared_future<int64_t> from_rank0 = chosen.get_future().share();
  std::vector<AgreedCheckpoint> agreed(3);
  const auto run_rank = [&](int rank) {
    AgreeOptions options;
    options.directory = root_.string();
    options.rank = rank;
    options.world_size = 3;
    options.broadcast_step = [&, rank](int64_t step) {
      if (rank == 0) {
        std::ofstream(fs::path(newest) / rank_file_name(1)) << "rewritten mid-resume";
        chosen.set_value(step);
      }
      return from_rank0.get();
    };
    agreed[rank] = agree_on_checkpoint(options);
  };
  std::thread rank0(run_rank, 0);
  from_rank0.wait();  // the others start only once the newest checkpoint looks torn
  std::thread rank1(run_rank, 1), rank2(run_rank, 2);
  for (std::thread* thread : {&rank0, &rank1, &rank2}) thread->join();
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(agreed[rank].path.has_value()) << "rank " << rank;
    EXPECT_EQ(*agreed[rank].path, newest) << "rank " << rank;
  }
  ASSERT_EQ(agreed[0].removed.size(), 1u);  // rank 0 cleaned up the killed write, alone
  EXPECT_FALSE(fs::exists(fs::path(newest) / ".rank-00001.pt.x1y2.tmp"));
  EXPECT_TRUE(agreed[1].removed.empty() && agreed[2].removed.empty());
  EXPECT_NE(verify(newest), "");  // what a rank looking for itself would have seen
}

TEST_F(CheckpointDir, ResumeAgreementStartsAfreshOrRefusesToGuess) {
  AgreeOptions options;
  options.directory = root_.string();
  EXPECT_FALSE(agree_on_checkpoint(options).path.has_value());  // nothing saved yet
  save(3, 1);
  const std::string torn = save(4, 1);
  fs::remove(fs::path(torn) / kManifest);
  const AgreedCheckpoint one = agree_on_checkpoint(options);
  ASSERT_TRUE(one.path.has_value());
  EXPECT_EQ(*one.path, (root_ / step_dir_name(3)).string());
  ASSERT_EQ(one.skipped.size(), 1u);
  EXPECT_NE(one.skipped[0].find("step-00000004"), std::string::npos) << one.skipped[0];
  options.world_size = 2;  // several ranks and no way to agree: refused, naming the option
  try {
    agree_on_checkpoint(options);
    FAIL() << "agree_on_checkpoint chose alone at world size 2";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("broadcast_step"), std::string::npos) << error.what();
  }
  options.rank = 2;
  EXPECT_THROW(agree_on_checkpoint(options), std::invalid_argument);
}

}  // namespace
}  // namespace shardwise::checkpoint
