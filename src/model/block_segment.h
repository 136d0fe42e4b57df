// One Qwen3 block as its own autograd segment. Two independent options:
// - recompute (activation checkpointing): forward runs the block without building a graph and keeps only its
//   input; backward runs it again with a graph and differentiates that. Memory per block drops from every
//   intermediate activation to the [B, T, H] input, for one extra forward.
// - a gradient sink (optimizer-in-backward): backward hands the block's parameter gradients to the sink as soon
//   as they exist, instead of accumulating them into .grad(), so they can be applied and freed block by block.
#pragma once
#include <ATen/core/Tensor.h>

#include "qwen3/model/model.h"

namespace qwen3 {

// The block's trainable tensors must be passed in `params` so autograd routes their gradients here.
at::Tensor block_segment(Qwen3Model& model, int64_t layer, const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin, const std::vector<at::Tensor>& params, bool recompute,
                         const BlockGradientSink* sink);

}  // namespace qwen3
