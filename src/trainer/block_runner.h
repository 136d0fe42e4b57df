// How the trainer runs each block: as its own autograd segment, with two independent options.
// - recompute (activation checkpointing): forward runs the block without building a graph and keeps only its
//   input; backward runs it again with a graph and differentiates that. Memory per block drops from every
//   intermediate activation to the [B, T, H] input, for one extra forward.
// - a gradient sink (optimizer-in-backward): backward hands the block's parameter gradients to the sink as soon
//   as they exist, instead of accumulating them into .grad(), so they can be applied and freed block by block.
// With neither, a block runs as the model runs it.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <utility>
#include <vector>

#include "qwen3/model/model.h"

namespace qwen3::train_detail {

// Whether activation checkpointing runs block `layer` again in backward: with it on, the first `recomputed_blocks`
// blocks (all where negative). The one rule the runner, the memory and time models and the trainer's setup read
// (recomputes_block in train_setup.h gives it the options).
inline bool recomputes_block(bool grad_checkpoint, int64_t recomputed_blocks, int64_t layer) {
  return grad_checkpoint && (recomputed_blocks < 0 || layer < recomputed_blocks);
}

// Receives, during backward, the gradients of one block's trainable tensors (parameter, gradient) as soon as
// they are complete; those parameters then get no .grad() from that block.
using BlockGradientSink =
    std::function<void(int64_t layer, const std::vector<std::pair<at::Tensor, at::Tensor>>& param_grads)>;

class TrainingBlockRunner final : public BlockRunner {
 public:
  // recompute: activation checkpointing for the first `recomputed_blocks` blocks (all where negative).
  explicit TrainingBlockRunner(bool recompute, int64_t recomputed_blocks = -1)
      : recompute_(recompute), recomputed_blocks_limit_(recomputed_blocks) {}
  // Set for a step (before its forward, which decides how each block's backward will run), cleared after.
  void set_gradient_sink(BlockGradientSink sink) { sink_ = std::move(sink); }

  at::Tensor run(Qwen3Model& model, int64_t layer, const at::Tensor& x, const at::Tensor& cos,
                 const at::Tensor& sin, const at::Tensor& allowed) override;

  // Blocks run again in backward so far: how the trainer (and a test) sees that checkpointing really
  // recomputed rather than kept the activations.
  int64_t recomputed_blocks() const { return recomputed_blocks_; }

  // For the segment's backward.
  bool recompute(int64_t layer) const { return recomputes_block(recompute_, recomputed_blocks_limit_, layer); }
  const BlockGradientSink* sink() const { return sink_ ? &sink_ : nullptr; }
  at::Tensor run_again(Qwen3Model& model, int64_t layer, const at::Tensor& x, const at::Tensor& cos,
                       const at::Tensor& sin, const at::Tensor& allowed) {
    ++recomputed_blocks_;
    // Backward differentiates the output; the next block's input was kept from forward, so nothing reads it.
    return model.run_block(layer, x, cos, sin, allowed, BlockOutput::differentiated);
  }

 private:
  bool recompute_;
  int64_t recomputed_blocks_limit_;
  BlockGradientSink sink_;
  int64_t recomputed_blocks_ = 0;
};

// The embedding lookup whose backward adds each row's gradient into the table's .grad() in place (index_add_)
// instead of returning a dense [V, H] gradient for autograd to accumulate (and sum with a tied head's).
at::Tensor embedding_into_grad(const at::Tensor& table, const at::Tensor& ids);

}  // namespace qwen3::train_detail
