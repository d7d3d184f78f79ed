// Saving tensors as a safetensors file from LibTorch (the full model a C++ run exports, which
// Hugging Face's safetensors and shardwise-train read). The file is written beside its final
// path, flushed to disk and renamed over it, so a crash during the save never leaves a torn file
// and never destroys the previous one.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <map>
#include <string>

namespace shardwise::checkpoint {

// Writes `tensors` (any device; copied to contiguous CPU memory) in their order. Throws
// std::runtime_error naming `path` when it cannot be written, std::invalid_argument naming the
// tensor when safetensors cannot store it.
void save_safetensors(const std::string& path,
                      const torch::OrderedDict<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace shardwise::checkpoint
