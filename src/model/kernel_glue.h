// The model's libtorch side of the CUDA kernels (activation_ops.cpp, lm_loss.cpp): the kernels' dtype of an
// activation, the current stream, and a failed launch as a qwen3::Error. Only in a build with the kernels and a
// CUDA libtorch (QWEN3_MODEL_KERNELS is then defined); elsewhere this header declares nothing.
#pragma once
#if defined(QWEN3_WITH_CUDA_KERNELS) && defined(QWEN3_TORCH_HAS_CUDA)
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <string>

#include "qwen3/base/error.h"
#include "qwen3_kernels.h"

#define QWEN3_MODEL_KERNELS 1

namespace qwen3::kernel_glue {

// fp32 or bf16: the two activation dtypes the model's kernels take (callers check which they have).
inline kernels::KernelDType activation_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? kernels::KernelDType::bf16 : kernels::KernelDType::f32;
}

inline void* current_stream(const at::Tensor& t) {
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
}

inline void check_launch(int status, const std::string& what) {
  if (status != 0)
    throw Error(what + " CUDA kernel failed: " + cudaGetErrorString(static_cast<cudaError_t>(status)));
}

}  // namespace qwen3::kernel_glue
#endif
