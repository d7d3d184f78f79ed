#include "checkpoint/training_checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "checkpoint/atomic_file.h"

namespace shardwise::checkpoint {
namespace fs = std::filesystem;
namespace {

c10::impl::GenericDict string_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

const c10::IValue& member(const c10::impl::GenericDict& dict,
                          const std::string& key,
                          const std::string& where) {
  auto it = dict.find(key);
  TORCH_CHECK_VALUE(it != dict.end(), where, ": no \"", key, "\" in the checkpoint payload");
  return it->value();
}

c10::IValue zero_payload(const ZeroCheckpoint& zero) {
  c10::impl::GenericList pieces(c10::AnyType::get());
  for (const auto& piece : zero.pieces) {
    auto tensors = string_dict();
    for (const auto& [name, t] : piece.tensors) tensors.insert(name, t.detach().contiguous());
    auto entry = string_dict();
    entry.insert("param", piece.info.param);
    entry.insert("start", piece.info.start);
    entry.insert("numel", piece.info.numel);
    entry.insert("full_numel", piece.info.full_numel);
    entry.insert("tensors", tensors);
    pieces.push_back(entry);
  }
  auto out = string_dict();
  out.insert("pieces", pieces);
  out.insert("step", zero.step);
  out.insert("scaler", c10::IValue());
  out.insert("micro_steps", zero.micro_steps);
  return out;
}

ZeroCheckpoint zero_from_payload(const c10::impl::GenericDict& dict, const std::string& where) {
  const auto& scaler = member(dict, "scaler", where);
  TORCH_CHECK_VALUE(scaler.isNone(), where,
                    ": a ZeRO checkpoint with fp16 loss scaling; this "
                    "trainer runs fp32");
  ZeroCheckpoint zero;
  zero.step = member(dict, "step", where).toInt();
  zero.micro_steps = member(dict, "micro_steps", where).toInt();
  for (const auto& item : member(dict, "pieces", where).toList()) {
    const auto piece = item.get().toGenericDict();
    zero::StatePiece out;
    out.info = {member(piece, "param", where).toInt(), member(piece, "start", where).toInt(),
                member(piece, "numel", where).toInt(), member(piece, "full_numel", where).toInt()};
    for (const auto& entry : member(piece, "tensors", where).toGenericDict()) {
      out.tensors[entry.key().toStringRef()] = entry.value().toTensor();
    }
    zero.pieces.push_back(std::move(out));
  }
  return zero;
}

}  // namespace

c10::IValue to_payload(const TrainingState& state) {
  auto data = string_dict();
  data.insert("epoch", state.data_epoch);
  data.insert("index", state.data_index);
  c10::impl::GenericList pieces(c10::AnyType::get());
  for (const auto& piece : state.pieces) {
    auto entry = string_dict();
    entry.insert("name", piece.name);
    entry.insert("start", piece.start);
    entry.insert("values", piece.values.detach().contiguous());
    pieces.push_back(entry);
  }
  auto payload = string_dict();
  payload.insert("step", state.step);
  payload.insert("optimizer_step", state.optimizer_step);
  payload.insert("rng", state.rng.defined() ? c10::IValue(state.rng) : c10::IValue());
  payload.insert("data", data);
  if (state.zero) {
    payload.insert("zero", zero_payload(*state.zero));
  } else {
    payload.insert("pieces", pieces);
    payload.insert("scaler", c10::IValue());
  }
  return payload;
}

TrainingState from_payload(const c10::IValue& payload, const std::string& where) {
  TORCH_CHECK_VALUE(payload.isGenericDict(), where, ": not a training checkpoint payload");
  const auto dict = payload.toGenericDict();
  TrainingState state;
  state.step = member(dict, "step", where).toInt();
  state.optimizer_step = member(dict, "optimizer_step", where).toInt();
  const auto& rng = member(dict, "rng", where);
  if (rng.isTensor()) state.rng = rng.toTensor();
  const auto data = member(dict, "data", where).toGenericDict();
  state.data_epoch = member(data, "epoch", where + " data").toInt();
  state.data_index = member(data, "index", where + " data").toInt();
  if (dict.find("zero") != dict.end()) {
    state.zero = zero_from_payload(member(dict, "zero", where).toGenericDict(), where + " zero");
    return state;
  }
  for (const auto& item : member(dict, "pieces", where).toList()) {
    const auto piece = item.get().toGenericDict();
    state.pieces.push_back({member(piece, "name", where + " piece").toStringRef(),
                            member(piece, "start", where + " piece").toInt(),
                            member(piece, "values", where + " piece").toTensor()});
  }
  return state;
}

std::string save_training_checkpoint(const TrainingState& state, const SaveOptions& options) {
  TORCH_CHECK_VALUE(options.rank >= 0 && options.rank < options.world_size, "checkpoint: rank ",
                    options.rank, " outside [0, ", options.world_size, ")");
  TORCH_CHECK_VALUE(options.keep_last >= 1, "checkpoint: keep_last ", options.keep_last,
                    " must be at least 1");
  TORCH_CHECK_VALUE(options.world_size == 1 || options.barrier,
                    "checkpoint: a barrier is needed with ", options.world_size, " ranks");
  const fs::path step_dir = fs::path(options.directory) / step_dir_name(state.step);
  fs::create_directories(step_dir);
  if (options.rank == 0) {  // re-saving a step (after resuming from an earlier one)
    std::error_code error;
    fs::remove(step_dir / kManifest, error);
  }
  const std::vector<char> bytes = torch::pickle_save(to_payload(state));
  atomic_write((step_dir / rank_file_name(options.rank)).string(), {{bytes.data(), bytes.size()}},
               "checkpoint");
  if (options.barrier) options.barrier();
  if (options.rank == 0) {
    write_manifest(step_dir.string(), state.step, options.world_size, options.config_yaml);
    prune(options.directory, options.keep_last, state.step);
  }
  if (options.barrier) options.barrier();
  return step_dir.string();
}

std::optional<LoadedCheckpoint> load_latest_training_checkpoint(const LoadOptions& options) {
  TORCH_CHECK_VALUE(options.world_size == 1 || options.barrier,
                    "checkpoint: a barrier is needed with ", options.world_size, " ranks");
  AgreeOptions agree;
  agree.directory = options.directory;
  agree.rank = options.rank;
  agree.world_size = options.world_size;
  agree.broadcast_step = options.broadcast_step;
  AgreedCheckpoint agreed = agree_on_checkpoint(agree);
  if (!agreed.path) return std::nullopt;
  LoadedCheckpoint out;
  out.path = *agreed.path;
  out.skipped = std::move(agreed.skipped);
  out.removed = std::move(agreed.removed);
  out.manifest = read_manifest(out.path);
  for (int r = 0; r < out.manifest.world_size; ++r) {
    const std::string file = (fs::path(out.path) / rank_file_name(r)).string();
    std::ifstream in(file, std::ios::binary);
    TORCH_CHECK(in, file, ": cannot be read");
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    out.ranks.push_back(from_payload(torch::pickle_load(bytes), file));
  }
  if (options.barrier) options.barrier();  // every rank has read before any saves again
  return out;
}

std::optional<LoadedCheckpoint> load_latest_training_checkpoint(const std::string& directory) {
  LoadOptions options;
  options.directory = directory;
  return load_latest_training_checkpoint(options);
}

}  // namespace shardwise::checkpoint
