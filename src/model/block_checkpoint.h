// Activation checkpointing of one Qwen3 block: forward runs the block without building a graph and keeps only
// its input; backward runs it again with a graph and differentiates that. Memory per block drops from every
// intermediate activation to the [B, T, H] input, for one extra forward.
#pragma once
#include <ATen/core/Tensor.h>

namespace qwen3 {

class Qwen3Model;

// The block's trainable tensors must be passed in `params` so autograd routes their gradients here.
at::Tensor checkpointed_block(Qwen3Model& model, int64_t layer, const at::Tensor& x, const at::Tensor& cos,
                              const at::Tensor& sin, const std::vector<at::Tensor>& params);

}  // namespace qwen3
