#include "checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "checkpoint/atomic_file.h"
#include "checkpoint/sha256.h"
#include "common/json.h"

namespace shardwise::checkpoint {
namespace fs = std::filesystem;
namespace {

// (step, path) of every step folder, oldest first.
std::vector<std::pair<int64_t, fs::path>> step_dirs(const std::string& directory) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code error;
  if (!fs::is_directory(directory, error)) return found;
  static const std::regex pattern("^step-(\\d{8,})$");
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && std::regex_match(name, match, pattern)) {
      found.push_back({std::stoll(match[1].str()), entry.path()});
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

std::string rank_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.pt", rank);
  return name;
}

// Keys sorted and indented by 2, as Python's json.dumps(indent=2, sort_keys=True) writes them.
std::string manifest_json(const Manifest& m) {
  std::ostringstream out;
  out << "{\n  \"config_yaml\": " << json::quote(m.config_yaml) << ",\n  \"files\": {";
  bool first = true;
  for (const auto& [name, record] : m.files) {
    out << (first ? "\n" : ",\n") << "    " << json::quote(name)
        << ": {\n      \"sha256\": " << json::quote(record.sha256)
        << ",\n      \"size\": " << record.size << "\n    }";
    first = false;
  }
  out << (m.files.empty() ? "}" : "\n  }") << ",\n  \"format\": " << m.format
      << ",\n  \"step\": " << m.step << ",\n  \"world_size\": " << m.world_size << "\n}";
  return out.str();
}

Manifest parse_manifest(const std::string& text, const std::string& where) {
  const json::Value root = json::parse(text);
  Manifest m;
  m.format = root.at("format", where).as_integer(where + " format");
  m.step = root.at("step", where).as_integer(where + " step");
  if (root.object.count("config_yaml")) {
    m.config_yaml = root.at("config_yaml", where).as_string(where + " config_yaml");
  }
  if (m.format != 1) {
    throw std::invalid_argument(where + ": format " + std::to_string(m.format) +
                                " is not 1, the only one this version reads");
  }
  if (m.step < 0) throw std::invalid_argument(where + ": step " + std::to_string(m.step) + " < 0");
  const json::Value& files = root.at("files", where);
  if (files.kind != json::Value::Kind::kObject) {
    throw std::invalid_argument(where + ": files is not an object");
  }
  // Checked before anything loops over the ranks: a hostile world_size must not cost memory.
  const int64_t world_size = root.at("world_size", where).as_integer(where + " world_size");
  if (world_size < 1 || static_cast<size_t>(world_size) != files.object.size()) {
    throw std::invalid_argument(where + ": world_size " + std::to_string(world_size) + " but " +
                                std::to_string(files.object.size()) +
                                " files listed; expected one file per rank, at least one");
  }
  m.world_size = static_cast<int>(world_size);
  for (const auto& [name, entry] : files.object) {
    const std::string field = where + " files." + name;
    FileRecord record{entry.at("size", field).as_integer(field + ".size"),
                      entry.at("sha256", field).as_string(field + ".sha256")};
    if (record.size < 0 || record.sha256.size() != 64) {
      throw std::invalid_argument(field + ": size must be >= 0 and sha256 64 hex digits");
    }
    m.files[name] = record;
  }
  return m;
}

FileRecord file_record(const std::string& path) {
  return {static_cast<int64_t>(fs::file_size(path)), sha256_file(path)};
}

Manifest write_manifest(const std::string& step_dir,
                        int64_t step,
                        int world_size,
                        const std::string& config_yaml,
                        const std::map<std::string, FileRecord>& reported) {
  Manifest m;
  m.step = step;
  m.world_size = world_size;
  m.config_yaml = config_yaml;
  for (int r = 0; r < world_size; ++r) {
    const fs::path path = fs::path(step_dir) / rank_file_name(r);
    std::error_code error;
    if (!fs::is_regular_file(path, error)) {
      throw std::runtime_error(path.string() + " missing after the barrier: rank " +
                               std::to_string(r) + " did not save");
    }
    const auto report = reported.find(rank_file_name(r));
    if (report == reported.end()) {
      m.files[rank_file_name(r)] = file_record(path.string());
      continue;
    }
    const auto size = static_cast<int64_t>(fs::file_size(path));
    if (size != report->second.size) {
      throw std::runtime_error(path.string() + " has " + std::to_string(size) +
                               " bytes, but rank " + std::to_string(r) + " reported writing " +
                               std::to_string(report->second.size));
    }
    m.files[rank_file_name(r)] = report->second;
  }
  atomic_write((fs::path(step_dir) / kManifest).string(), manifest_json(m), "checkpoint manifest");
  return m;
}

std::string verify(const std::string& step_dir) {
  const fs::path manifest_path = fs::path(step_dir) / kManifest;
  std::error_code error;
  if (!fs::is_regular_file(manifest_path, error)) {
    return manifest_path.string() + " missing: incomplete checkpoint (crash during save?)";
  }
  Manifest m;
  try {
    m = parse_manifest(read_text(manifest_path), manifest_path.string());
  } catch (const std::exception& e) {
    return manifest_path.string() + " unreadable: " + e.what();
  }
  const std::string folder = fs::path(step_dir).filename().string();
  if (folder.rfind("step-", 0) == 0 && folder != step_dir_name(m.step)) {
    return manifest_path.string() + " is for step " + std::to_string(m.step) +
           ", not the folder's (moved or tampered with)";
  }
  std::vector<std::string> expected, listed;
  for (int r = 0; r < m.world_size; ++r) expected.push_back(rank_file_name(r));
  for (const auto& [name, record] : m.files) listed.push_back(name);
  if (listed != expected) {
    return manifest_path.string() + " lists " + std::to_string(listed.size()) +
           " files, expected one per rank of " + std::to_string(m.world_size);
  }
  for (const auto& [name, record] : m.files) {
    const fs::path path = fs::path(step_dir) / name;
    if (!fs::is_regular_file(path, error)) return path.string() + " missing";
    const auto size = static_cast<int64_t>(fs::file_size(path, error));
    if (size != record.size) {
      return path.string() + " is " + std::to_string(size) + " bytes, manifest says " +
             std::to_string(record.size) + " (truncated?)";
    }
    if (sha256_file(path.string()) != record.sha256) {
      return path.string() + " SHA-256 mismatch (corrupted)";
    }
  }
  return "";
}

Manifest read_manifest(const std::string& step_dir) {
  const fs::path path = fs::path(step_dir) / kManifest;
  return parse_manifest(read_text(path), path.string());
}

std::optional<LatestCheckpoint> latest(const std::string& directory,
                                       std::vector<std::string>* skipped) {
  std::vector<std::string> reasons;
  const auto dirs = step_dirs(directory);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const std::string path = it->second.string();
    const std::string reason = verify(path);
    if (reason.empty()) {
      LatestCheckpoint found;
      found.path = path;
      found.manifest =
          parse_manifest(read_text(it->second / kManifest), (it->second / kManifest).string());
      found.skipped = reasons;
      if (skipped) *skipped = reasons;
      return found;
    }
    reasons.push_back("skipping checkpoint " + path + ": " + reason);
  }
  if (skipped) *skipped = reasons;
  return std::nullopt;
}

std::vector<std::string> remove_temporary_files(const std::string& directory) {
  static const std::regex temporary(R"(^\..+\.tmp$|^.+\.tmp\.\d+$)");
  std::vector<fs::path> folders{directory};
  for (const auto& [step, path] : step_dirs(directory)) folders.push_back(path);
  std::vector<std::string> removed;
  std::error_code error;
  for (const fs::path& folder : folders) {
    for (const auto& entry : fs::directory_iterator(folder, error)) {
      if (entry.is_regular_file(error) &&
          std::regex_match(entry.path().filename().string(), temporary) &&
          fs::remove(entry.path(), error)) {
        removed.push_back(entry.path().string());
      }
    }
  }
  return removed;
}

std::vector<std::string> prune(const std::string& directory, int keep_last, int64_t newest_step) {
  if (keep_last < 1) {
    throw std::invalid_argument("keep_last " + std::to_string(keep_last) + " must be at least 1");
  }
  std::vector<std::string> deleted;
  int quota = keep_last - 1;  // the checkpoint at newest_step counts as one
  const auto dirs = step_dirs(directory);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->first >= newest_step) continue;
    std::error_code error;
    if (quota > 0 && fs::is_regular_file(it->second / kManifest, error)) {
      --quota;
      continue;
    }
    fs::remove_all(it->second, error);
    deleted.push_back(it->second.string());
  }
  return deleted;
}

}  // namespace shardwise::checkpoint
