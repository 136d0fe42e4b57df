// libtorch glue to the group clipping kernel (kernels/grad_clip.cu): the gradients' device and current stream, a
// workspace from the caching allocator, no synchronization. Real only with both the CUDA kernels and a CUDA
// libtorch; otherwise a clear error (no CUDA tensor can reach it in such a build anyway).
#include "optim/grad_clip_cuda.h"

#include <string>

#include "qwen3/base/error.h"

#if defined(QWEN3_WITH_CUDA_KERNELS) && defined(QWEN3_TORCH_HAS_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "qwen3_kernels.h"

namespace qwen3::optim_detail {

void group_clip_cuda(const std::vector<at::Tensor>& grads, const GroupClipOnDevice& group) {
  const at::Device device = grads.front().device();
  const c10::cuda::CUDAGuard device_guard(device);
  std::vector<kernels::GradClipTensor> tensors;
  for (const at::Tensor& g : grads) {
    if (g.device() != device || !g.is_contiguous() || (g.scalar_type() != at::kFloat && g.scalar_type() != at::kBFloat16))
      throw Error("gradient clipping: a gradient is " + std::string(c10::toString(g.scalar_type())) + " on " +
                  g.device().str() + (g.is_contiguous() ? "" : ", not contiguous") + "; contiguous float32 or bfloat16 on " +
                  device.str() + " expected");
    tensors.push_back({g.data_ptr(), g.numel(),
                       g.scalar_type() == at::kBFloat16 ? kernels::KernelDType::bf16 : kernels::KernelDType::f32});
  }
  const int count = static_cast<int>(tensors.size());
  // Freed on the host after the launch: the caching allocator hands it out again only to work queued after it.
  const at::Tensor workspace = at::empty({kernels::grad_clip_workspace_doubles(tensors.data(), count)},
                                         at::TensorOptions().dtype(at::kDouble).device(device));
  kernels::GradClipGroup g;
  g.max_norm = group.max_norm;
  g.trainable = group.trainable;
  g.counted_elements = group.counted_elements;
  if (group.ranks_with_gradient.defined()) {
    g.ranks_with_gradient = group.ranks_with_gradient.data_ptr<float>();
    g.numels_device = group.numels.data_ptr<double>();
  }
  g.sum = group.sum.defined() ? group.sum.data_ptr<double>() : nullptr;
  g.tensor_squares = group.tensor_squares.defined() ? group.tensor_squares.data_ptr<double>() : nullptr;
  g.accumulate = group.accumulate ? 1 : 0;
  g.factors = group.factors.defined() ? group.factors.data_ptr<float>() : nullptr;
  const int status = kernels::launch_grad_clip(tensors.data(), count, g, workspace.data_ptr<double>(),
                                               static_cast<void*>(c10::cuda::getCurrentCUDAStream(device.index()).stream()));
  if (status != 0)
    throw Error(std::string("gradient clipping CUDA kernel failed: ") + cudaGetErrorString(static_cast<cudaError_t>(status)));
}

}  // namespace qwen3::optim_detail

#else

namespace qwen3::optim_detail {

void group_clip_cuda(const std::vector<at::Tensor>&, const GroupClipOnDevice&) {
  throw Error("gradient clipping: this build has no CUDA kernels (built without nvcc or without a CUDA libtorch)");
}

}  // namespace qwen3::optim_detail

#endif
