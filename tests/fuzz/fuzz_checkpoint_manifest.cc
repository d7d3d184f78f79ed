// libFuzzer target: checkpoint manifests (checkpoint/checkpoint_dir.h) and the JSON reader under
// them (common/json.h), what a checkpoint folder on disk hands the loader. Any text must parse or
// be refused with std::invalid_argument; a manifest that parses must be re-written by
// manifest_json and parse back equal; verify() on a folder holding it must return a reason, not
// crash or read outside the folder (the fuzzer's folder has no rank files).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "checkpoint/checkpoint_dir.h"
#include "common/json.h"

namespace ckpt = shardwise::checkpoint;
namespace fs = std::filesystem;

namespace {

const fs::path& scratch() {
  static const fs::path dir = [] {
    char name[] = "/tmp/shardwise-fuzz-manifest-XXXXXX";
    if (::mkdtemp(name) == nullptr) std::abort();
    std::atexit([] { fs::remove_all(scratch()); });
    return fs::path(name);
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto value = shardwise::json::parse(text);
    (void)shardwise::json::quote(value.kind == shardwise::json::Value::Kind::kString ? value.string
                                                                                     : text);
  } catch (const std::invalid_argument&) {
  }
  ckpt::Manifest manifest;
  try {
    manifest = ckpt::parse_manifest(text, "manifest.json");
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const ckpt::Manifest again = ckpt::parse_manifest(ckpt::manifest_json(manifest), "rewritten");
  if (again.step != manifest.step || again.world_size != manifest.world_size ||
      again.files.size() != manifest.files.size() || again.config_yaml != manifest.config_yaml) {
    __builtin_trap();  // manifest_json and parse_manifest disagree
  }
  const fs::path step_dir = scratch() / "step-00000001";
  fs::create_directories(step_dir);
  std::ofstream(step_dir / ckpt::kManifest, std::ios::binary | std::ios::trunc) << text;
  if (ckpt::verify(step_dir.string()).empty()) __builtin_trap();  // no rank file exists
  return 0;
}
