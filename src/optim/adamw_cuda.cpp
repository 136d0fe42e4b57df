// libtorch glue to the fused AdamW kernel: the current stream of the parameter's device, no synchronization.
// Real only with both the CUDA kernels and a CUDA libtorch; otherwise a clear error (no CUDA tensor can reach it
// in such a build anyway).
#include <string>

#include "optim/adamw_step.h"
#include "qwen3/base/error.h"

#if defined(QWEN3_WITH_CUDA_KERNELS) && defined(QWEN3_TORCH_HAS_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "qwen3_kernels.h"

namespace qwen3::optim_detail {

void adamw_step_cuda(const kernels::adamw::ParamView& param, const kernels::adamw::StepScalars& scalars,
                     int device_index) {
  const c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device_index));
  const int status = kernels::launch_adamw_step(
      param, scalars, static_cast<void*>(c10::cuda::getCurrentCUDAStream(device_index).stream()));
  if (status != 0)
    throw Error(std::string("AdamW CUDA kernel failed: ") + cudaGetErrorString(static_cast<cudaError_t>(status)));
}

}  // namespace qwen3::optim_detail

#else

namespace qwen3::optim_detail {

void adamw_step_cuda(const kernels::adamw::ParamView&, const kernels::adamw::StepScalars&, int) {
  throw Error("AdamW: this build has no CUDA optimizer kernel (built without nvcc or without a CUDA libtorch)");
}

}  // namespace qwen3::optim_detail

#endif
