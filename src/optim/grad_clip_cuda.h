// A group's gradient clipping by the CUDA kernel of kernels/grad_clip.cu: one launch (per 64 tensors) reads every
// gradient once and writes the group's squared norm and its clipping factors on the device. The caller
// (grad_clip.cpp) makes the output tensors; this file only launches.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace qwen3::optim_detail {

struct GroupClipOnDevice {
  double max_norm = 0, trainable = 1, counted_elements = 0;
  at::Tensor ranks_with_gradient;  // fp32 [n] on the device, or undefined
  at::Tensor numels;               // fp64 [n] on the device, with ranks_with_gradient
  at::Tensor sum;                  // fp64 0-dim on the device (or undefined): the group's square written, or added with accumulate
  bool accumulate = false;
  at::Tensor factors;         // fp32 [n] on the device, or undefined
  at::Tensor tensor_squares;  // fp64 [n] on the device, or undefined: each gradient's own square
};

// grads: at least one, all on one CUDA device, contiguous fp32/bf16 (an Error names the first that is not).
// Throws qwen3::Error in a build without the CUDA kernels or without a CUDA libtorch.
void group_clip_cuda(const std::vector<at::Tensor>& grads, const GroupClipOnDevice& group);

}  // namespace qwen3::optim_detail
