// The checkpoint folder of shardwise-train (python/shardwise/train/checkpoint.py), torch-free, so
// the C++ trainer writes and reads the same checkpoints:
//
//   directory/step-00000100/rank-00000.pt   one file per rank, written by that rank
//   directory/step-00000100/manifest.json   written LAST by rank 0: format, step, world_size,
//                                           every rank file's size and SHA-256, config_yaml
//
// A checkpoint is complete only when its manifest exists and every file matches it; latest()
// skips newer incomplete or corrupt ones (saying why) and returns the newest intact one. prune()
// keeps the keep_last newest complete checkpoints and never touches the newest step or anything
// newer.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace shardwise::checkpoint {

std::string step_dir_name(int64_t step);  // "step-00000100"
std::string rank_file_name(int rank);     // "rank-00000.pt"
inline constexpr const char* kManifest = "manifest.json";

struct FileRecord {
  int64_t size = 0;
  std::string sha256;
};

struct Manifest {
  int64_t format = 1;
  int64_t step = 0;
  int world_size = 0;
  std::map<std::string, FileRecord> files;  // rank file name -> its record
  std::string config_yaml;                  // the run's configuration (text)
};

std::string manifest_json(const Manifest& manifest);
// Throws std::invalid_argument naming `where` and the missing or malformed field.
Manifest parse_manifest(const std::string& text, const std::string& where);
// `step_dir`'s manifest, parsed (throws naming the file when it is missing or malformed).
Manifest read_manifest(const std::string& step_dir);

// A file's size and SHA-256 (throws naming the path when it cannot be read).
FileRecord file_record(const std::string& path);

// The records of the rank files of `step_dir` (every rank's must exist: an error names the rank
// that did not save) written atomically as the manifest. Returns it. `reported`: records the
// ranks computed of their own files (rank file name -> record), so that the hashing is shared
// out; a file whose size differs from its report is an error naming the rank, and a rank that
// did not report is hashed here.
Manifest write_manifest(const std::string& step_dir,
                        int64_t step,
                        int world_size,
                        const std::string& config_yaml,
                        const std::map<std::string, FileRecord>& reported = {});

// Empty when `step_dir` is a complete, intact checkpoint, else the reason it is not.
std::string verify(const std::string& step_dir);

struct LatestCheckpoint {
  std::string path;  // the step folder
  Manifest manifest;
  std::vector<std::string> skipped;  // "skipping checkpoint <path>: <reason>", newest first
};

// The newest intact checkpoint under `directory`; nullopt when there is none (`skipped` is then
// lost: pass `skipped` to keep the reasons).
std::optional<LatestCheckpoint> latest(const std::string& directory,
                                       std::vector<std::string>* skipped = nullptr);

// Deletes the temporary files of writes that never finished under `directory` and its step
// folders (".<name>.<random>.tmp" from Python, "<name>.tmp.<pid>" from C++: a writer killed
// mid-write cannot remove its own); returns what it deleted. Call it only when no rank is
// writing (at start-up, before any save).
std::vector<std::string> remove_temporary_files(const std::string& directory);

// Deletes step folders older than `newest_step` beyond the `keep_last` newest complete ones
// (incomplete leftovers included); returns what it deleted. keep_last >= 1.
std::vector<std::string> prune(const std::string& directory, int keep_last, int64_t newest_step);

}  // namespace shardwise::checkpoint
