// Flags shared by the commands that run a model: where (--device) and in what precision (--dtype).
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

#include "cli_common.h"

namespace qwen3::cli {

struct RuntimeOptions {
  std::string device = "cpu";
  std::string dtype = "auto";
};

void add_runtime_options(CLI::App* sub, RuntimeOptions& o);
// "cpu" or "cuda[:N]"; a CUDA device this build or machine lacks is a clear Error.
c10::Device resolve_device(const std::string& name);
// "auto" is float32 on CPU and bfloat16 on CUDA.
c10::ScalarType resolve_dtype(const std::string& name, const c10::Device& device);

// "1 2 3" -> ids; anything else is an Error naming `where` (a flag, or file:line) and the bad token.
std::vector<int64_t> parse_token_ids(const std::string& text, const std::string& where);

}  // namespace qwen3::cli
