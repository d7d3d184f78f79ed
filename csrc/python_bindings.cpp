// The Python module shardwise._C: importing it loads the op registrations of this library.
// Below: the run-time CPU dispatch (common/cpu_features.h), the backend's factory, checkpoint
// pieces, the data files, and the FSDP, ZeRO, pipeline and tensor-parallel classes the Python
// package adapts.
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/op_log.hpp"
#include "backend/shardwise_backend.hpp"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/resume_agreement.h"
#include "checkpoint/safetensors.h"
#include "collectives/shm_transport.h"
#include "collectives/tcp_transport.h"
#include "common/cpu_features.h"
#include "data/token_file_tensor.h"
#include "data/token_stream.h"
#include "distributed/process_group.h"
#include "fsdp/fsdp_python.h"
#include "optim/optim_python.h"
#include "optim/warmup_schedule.h"
#include "pipeline/pipeline_python.h"
#include "precision/precision_python.h"
#include "sharding/checkpoint_pieces.h"
#include "sharding/sharding_python.h"
#include "tensor_parallel/tp_python.h"
#include "training/training_python.h"
#include "zero/zero_python.h"

namespace py = pybind11;

namespace {

// The checkpoint folder's rules (checkpoint/checkpoint_dir.h) for shardwise.train.checkpoint;
// file-system failures arrive as OSError.
void bind_checkpoint_dir(py::module& m) {
  namespace ckpt = shardwise::checkpoint;
  auto os_errors = [](auto&& fn) {
    try {
      return fn();
    } catch (const std::runtime_error& e) {
      PyErr_SetString(PyExc_OSError, e.what());
      throw py::error_already_set();
    }
  };
  m.def(
      "checkpoint_write_manifest",
      [os_errors](const std::string& step_dir, int64_t step, int world, const std::string& config,
                  const std::map<std::string, std::pair<int64_t, std::string>>& reported) {
        std::map<std::string, ckpt::FileRecord> records;
        for (const auto& [name, record] : reported) records[name] = {record.first, record.second};
        os_errors([&] {
          py::gil_scoped_release release;
          return ckpt::write_manifest(step_dir, step, world, config, records).step;
        });
      },
      py::arg("step_dir"), py::arg("step"), py::arg("world_size"), py::arg("config_yaml"),
      py::arg("reported") = std::map<std::string, std::pair<int64_t, std::string>>{});
  m.def(
      "checkpoint_file_record",
      [os_errors](const std::string& path) {
        return os_errors([&] {
          py::gil_scoped_release release;
          const ckpt::FileRecord record = ckpt::file_record(path);
          return std::make_pair(record.size, record.sha256);
        });
      },
      py::arg("path"), "(size, SHA-256) of a file, as the manifest records it");
  m.def("checkpoint_verify", &ckpt::verify, py::arg("step_dir"),
        py::call_guard<py::gil_scoped_release>(), "'' if intact, else the reason it is not.");
  m.def(
      "checkpoint_latest",
      [](const std::string& directory) {
        std::vector<std::string> skipped;
        std::optional<std::string> path;
        {
          py::gil_scoped_release release;
          if (auto found = ckpt::latest(directory, &skipped)) path = found->path;
        }
        return std::make_pair(path, skipped);
      },
      py::arg("directory"), "(the newest intact step folder or None, the skipped with reasons)");
  m.def(
      "checkpoint_agree",
      [](const std::string& directory, int rank, int world_size,
         std::function<int64_t(int64_t)> broadcast_step) {
        ckpt::AgreeOptions options;
        options.directory = directory;
        options.rank = rank;
        options.world_size = world_size;
        options.broadcast_step = std::move(broadcast_step);
        ckpt::AgreedCheckpoint agreed = ckpt::agree_on_checkpoint(options);
        return std::make_tuple(agreed.path, agreed.removed, agreed.skipped);
      },
      py::arg("directory"), py::arg("rank"), py::arg("world_size"), py::arg("broadcast_step"),
      py::call_guard<py::gil_scoped_release>(),
      "Collective: (the step folder rank 0 chose or None, temporary files removed, skipped).");
  m.def("checkpoint_remove_temporary_files", &ckpt::remove_temporary_files, py::arg("directory"),
        py::call_guard<py::gil_scoped_release>());
  m.def("checkpoint_prune", &ckpt::prune, py::arg("directory"), py::arg("keep_last"),
        py::arg("newest_step"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() =
      "shardwise native library: torch.ops.shardwise.*, CPU dispatch, the backend, checkpoint "
      "pieces, and the FSDP / ZeRO / pipeline / tensor-parallel classes";
  m.def(
      "detected_cpu_isa",
      [] { return std::string(shardwise::cpu_isa_name(shardwise::detected_cpu_isa())); },
      "The best CPU instruction set this machine supports: 'scalar', 'avx512' or 'avx512_bf16'.");
  m.def(
      "active_cpu_isa",
      [] { return std::string(shardwise::cpu_isa_name(shardwise::active_cpu_isa())); },
      "The CPU instruction set the kernels use now.");
  m.def(
      "set_cpu_isa",
      [](std::optional<std::string> name) {
        try {
          shardwise::set_cpu_isa(name ? std::optional(shardwise::parse_cpu_isa(*name))
                                      : std::nullopt);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("name"),
      "Lower the CPU instruction set the kernels use ('scalar', 'avx512', 'avx512_bf16'), or "
      "None to use the best one again.");

  m.def(
      "fill_from_pieces",
      [](const std::vector<std::tuple<std::string, int64_t, at::Tensor>>& slots,
         const std::vector<std::tuple<std::string, int64_t, at::Tensor>>& pieces, bool strict) {
        auto convert = [](const auto& list) {
          std::vector<shardwise::sharding::TensorSlice> out;
          for (const auto& [name, start, values] : list) out.push_back({name, start, values});
          return out;
        };
        try {
          shardwise::sharding::fill_from_pieces(convert(slots), convert(pieces), strict);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("slots"), py::arg("pieces"), py::arg("strict") = true,
      "Copies the overlaps of saved (name, start, values) pieces into (name, start, view) slots "
      "(sharding/checkpoint_pieces.h).");
  {
    using shardwise::optim::WarmupScheduleOptions;
    py::class_<WarmupScheduleOptions>(
        m, "WarmupSchedule",
        "DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR (optim/warmup_schedule.h).")
        .def(py::init([](const py::dict& d) {
               WarmupScheduleOptions o;
               auto get = [&](const char* key, auto& field) {
                 if (d.contains(key)) field = d[key].cast<std::decay_t<decltype(field)>>();
               };
               get("type", o.type);
               get("warmup_min_lr", o.warmup_min_lr);
               get("warmup_max_lr", o.warmup_max_lr);
               get("warmup_num_steps", o.warmup_num_steps);
               get("warmup_type", o.warmup_type);
               get("total_num_steps", o.total_num_steps);
               get("base_lr", o.base_lr);
               get("warmup_min_ratio", o.warmup_min_ratio);
               get("cos_min_ratio", o.cos_min_ratio);
               shardwise::optim::validate(o);
               return o;
             }),
             py::arg("options"))
        .def(
            "lr",
            [](const WarmupScheduleOptions& o, int64_t last_batch_iteration) {
              return shardwise::optim::warmup_schedule_lr(o, last_batch_iteration);
            },
            py::arg("last_batch_iteration"),
            "The lr after that many scheduler steps (-1: before the first).");
  }
  m.def("communication_seconds", &shardwise::backend::communication_seconds,
        "Seconds this process's shardwise backends have spent communicating (all groups).");
  m.def(
      "communication_stats",
      [] {
        py::dict out;
        for (const auto& [kind, s] : shardwise::backend::op_stats()) {
          out[py::str(kind)] = py::dict(py::arg("calls") = s.calls, py::arg("bytes") = s.bytes,
                                        py::arg("seconds") = s.seconds);
        }
        return out;
      },
      "Per operation kind, since the process started: calls, payload bytes and seconds of this "
      "process's shardwise backends (backend/op_log.hpp).");
  m.def(
      "shm_wait_stats",
      [] {
        const auto stats = shardwise::collectives::ShmTransport::wait_stats();
        return py::dict(py::arg("waits") = stats.waits, py::arg("sleeps") = stats.sleeps);
      },
      "Since the process started, over its shared-memory links: how often an exchange found "
      "nothing to move (waits), and how many of those ended asleep on a futex (sleeps).");
  m.def("tcp_bytes_sent", &shardwise::collectives::TcpTransport::bytes_sent,
        "Bytes this process has sent over TCP links since it started, headers included: with "
        "ranks on several hosts, what it sent to the other hosts (shared memory within one).");
  m.def(
      "_create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout) -> c10::intrusive_ptr<c10d::Backend> {
        // The SHARDWISE_* variables, read as LibTorch programs read them (distributed/).
        auto options = shardwise::distributed::ProcessGroupOptions::backend_options_from_env();
        options.timeout = timeout;
        return c10::make_intrusive<shardwise::backend::ShardwiseBackend>(store, rank, size,
                                                                         options);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>(),
      "Creates the shardwise c10d backend (used by torch.distributed's backend registry).");
  {
    using shardwise::data::TokenStream;
    py::class_<TokenStream>(
        m, "TokenStream",
        "The training data stream (data/token_stream.h): the same batches in C++ "
        "and Python.")
        .def(py::init([](const at::Tensor& tokens, int64_t seq_len, int64_t micro_batch,
                         int data_rank, int data_world, int64_t seed, bool shuffle, bool contiguous,
                         int64_t batches_per_step) {
               shardwise::data::TokenStreamOptions options{
                   seq_len, micro_batch, data_rank,  data_world,
                   seed,    shuffle,     contiguous, batches_per_step};
               return TokenStream(tokens, options);
             }),
             py::arg("tokens"), py::arg("seq_len"), py::arg("micro_batch"), py::arg("data_rank"),
             py::arg("data_world"), py::arg("seed"), py::arg("shuffle"),
             py::arg("contiguous") = false, py::arg("batches_per_step") = 1)
        .def("next", &TokenStream::next)
        .def("batch", &TokenStream::batch)
        .def("batch_windows", &TokenStream::batch_windows)
        .def("window_order", &TokenStream::window_order)
        .def("load_state", &TokenStream::load_state)
        .def_property_readonly("epoch", &TokenStream::epoch)
        .def_property_readonly("index", &TokenStream::index)
        .def_property_readonly("batches_per_epoch", &TokenStream::batches_per_epoch);
    using shardwise::data::BatchOrder;
    py::class_<BatchOrder>(m, "BatchOrder",
                           "Which items each data rank reads, batch after batch "
                           "(data/batch_order.h): the sampling rule of the training data.")
        .def(py::init([](int64_t num_items, int64_t micro_batch, int data_rank, int data_world,
                         int64_t seed, bool shuffle, bool contiguous, int64_t batches_per_step) {
               return BatchOrder(num_items, {micro_batch, data_rank, data_world, seed, shuffle,
                                             contiguous, batches_per_step});
             }),
             py::arg("num_items"), py::arg("micro_batch"), py::arg("data_rank"),
             py::arg("data_world"), py::arg("seed"), py::arg("shuffle"),
             py::arg("contiguous") = false, py::arg("batches_per_step") = 1)
        .def("next", &BatchOrder::next)
        .def("batch_items", &BatchOrder::batch_items)
        .def("order", &BatchOrder::order)
        .def("load_state", &BatchOrder::load_state)
        .def_property_readonly("epoch", &BatchOrder::epoch)
        .def_property_readonly("index", &BatchOrder::index)
        .def_property_readonly("batches_per_epoch", &BatchOrder::batches_per_epoch);
    m.def(
        "read_token_file",
        [](const std::string& path, const std::string& dtype) {
          return shardwise::data::read_token_file(path,
                                                  shardwise::data::token_type_from_name(dtype));
        },
        py::arg("path"), py::arg("dtype") = "uint16",
        "The tokens of a .bin file of `dtype` (nanoGPT's format) or a .npy file, memory-mapped "
        "read-only (data/token_file_tensor.h); ValueError naming the path when it is malformed.");
    m.def("token_ids", &shardwise::data::token_ids, py::arg("tokens"),
          "Token ids as int64 (uint16/uint32 widened without sign extension).");
    m.def("token_range", &shardwise::data::token_range, py::arg("tokens"),
          "(smallest, largest) token id, read in chunks.");
  }
  m.def(
      "save_safetensors",
      [](const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
         const std::map<std::string, std::string>& metadata) {
        torch::OrderedDict<std::string, at::Tensor> ordered;
        for (const auto& [name, tensor] : tensors) ordered.insert(name, tensor);
        shardwise::checkpoint::save_safetensors(path, ordered, metadata);
      },
      py::arg("path"), py::arg("tensors"),
      py::arg("metadata") = std::map<std::string, std::string>{},
      py::call_guard<py::gil_scoped_release>(),
      "Writes (name, tensor) pairs as a safetensors file, crash-safe (checkpoint/safetensors.h).");
  bind_checkpoint_dir(m);
  shardwise::fsdp::bind_fsdp(m);
  shardwise::zero::bind_zero(m);
  shardwise::optim::bind_optim(m);
  shardwise::pipeline::bind_pipeline(m);
  shardwise::precision::bind_precision(m);
  shardwise::sharding::bind_sharding(m);
  shardwise::training::bind_training(m);
  shardwise::tensor_parallel::bind_tensor_parallel(m);
}
