#include <torch/version.h>

#include <string>

#include "cli_common.h"
#ifdef QWEN3_WITH_CUDA_KERNELS
#include "qwen3_kernels.h"
#endif

namespace qwen3::cli {

std::string version_text() {
  std::string s = tool_name_and_version() + "\nlibtorch " + TORCH_VERSION;
#ifdef QWEN3_WITH_CUDA_KERNELS
  s += std::string("\nCUDA kernels: built for sm ") + QWEN3_CUDA_ARCHS + "; CUDA devices visible: " +
       std::to_string(kernels::cuda_device_count());
#else
  s += "\nCUDA kernels: not built (no nvcc at configure time)";
#endif
  return s;
}

std::string tool_name_and_version() { return std::string("qwen3-train ") + QWEN3_VERSION; }

std::string git_hash() { return QWEN3_GIT_HASH; }

}  // namespace qwen3::cli
