// The Qwen3 causal LM as docs/model.md computes it. The model knows nothing of quantization: its
// projection weights are plain [out, in] tensors and every projection goes through `ProjectionOp`, which the
// loader or the trainer sets (a dense product for evaluation, the NVFP4 straight-through linear for training).
#pragma once
#include <torch/nn/module.h>

#include <array>
#include <functional>
#include <vector>

#include "qwen3/config/config.h"

namespace qwen3 {

// y = x · wᵀ for x [..., in], w [out, in].
using ProjectionOp = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& weight)>;
at::Tensor dense_projection(const at::Tensor& x, const at::Tensor& weight);

// Post-RoPE keys and values per layer, unexpanded [B, kv_heads, capacity, head_dim]; `length` positions used.
struct KVCache {
  std::vector<at::Tensor> keys, values;
  int64_t length = 0;
  int64_t capacity() const { return keys.empty() ? 0 : keys[0].size(2); }
};

// Receives, during backward, the gradients of one block's trainable tensors (parameter, gradient) as soon as
// they are complete; those parameters then get no .grad() from that block.
using BlockGradientSink =
    std::function<void(int64_t layer, const std::vector<std::pair<at::Tensor, at::Tensor>>& param_grads)>;

struct Qwen3Block {
  at::Tensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm, gate_proj, up_proj, down_proj, input_layernorm,
      post_attention_layernorm;
  // In file order (docs/model.md); the model maps file keys to these fields by name (Qwen3Model::field_of).
  std::array<const at::Tensor*, 11> tensors() const {
    return {&q_proj, &k_proj, &v_proj, &o_proj, &q_norm, &k_norm, &gate_proj, &up_proj, &down_proj,
            &input_layernorm, &post_attention_layernorm};
  }
};

class Qwen3Model : public torch::nn::Module {
 public:
  // Parameters are allocated uninitialized in `dtype` on `device`; load_weights fills them.
  Qwen3Model(const Qwen3Config& config, at::ScalarType dtype, at::Device device, bool separate_lm_head);
  // Not copyable: named_weights() reaches the fields through pointers into this object.
  Qwen3Model(const Qwen3Model&) = delete;
  Qwen3Model& operator=(const Qwen3Model&) = delete;

  const Qwen3Config& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }  // the parameters'
  at::Device device() const { return device_; }
  // The activations' dtype (products, residual stream, KV cache), the parameters' unless set: with fp32
  // parameters and bf16 compute every parameter is cast to bf16 where it is used (the cast is differentiable,
  // so gradients reach the parameters in their own dtype), the norms accumulate in fp32 and the logits are
  // fp32, as Megatron/HF mixed precision does.
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  void set_compute_dtype(at::ScalarType dtype);

  // Final hidden states [B, T, H] (after the final norm) for ids [B, T] at positions offset .. offset+T-1.
  // With a cache, the new keys/values are appended at `cache->length` (which is then the offset) and the
  // attention covers the cached prefix with the offset causal mask.
  at::Tensor hidden_states(const at::Tensor& ids, KVCache* cache = nullptr);
  at::Tensor logits(const at::Tensor& hidden);  // [.., H] -> [.., V] in fp32
  at::Tensor forward(const at::Tensor& ids, KVCache* cache = nullptr) { return logits(hidden_states(ids, cache)); }

  KVCache make_cache(int64_t batch, int64_t capacity) const;

  // Every named tensor in file order (the keys of qwen3.md), for loading, saving and the optimizer.
  std::vector<std::pair<std::string, at::Tensor>> named_weights() const;
  bool has_separate_lm_head() const { return lm_head_.defined(); }
  // The LM head's weight: lm_head, or the embedding when tied.
  const at::Tensor& head_weight() const { return lm_head_.defined() ? lm_head_ : embed_tokens; }

  void set_projection_op(ProjectionOp op) { project_ = std::move(op); }
  // Activation checkpointing per block (training without a cache): a block keeps only its input for backward
  // and recomputes itself there; gradients are identical to the plain path.
  void set_activation_checkpointing(bool on) { checkpoint_blocks_ = on; }
  // Optimizer-in-backward: while a sink is set, every block's parameter gradients go to it (see
  // BlockGradientSink) instead of .grad(). The embedding, final norm and lm_head still accumulate .grad().
  void set_block_gradient_sink(BlockGradientSink sink) { gradient_sink_ = std::move(sink); }
  // Training: the embedding's gradient is added into embed_tokens.grad() in place by the lookup's backward
  // (no dense [V, H] gradient, no out-of-place sum with a tied head's). Off, autograd accumulates it.
  void set_embedding_grad_in_place(bool on) { embedding_grad_in_place_ = on; }

  // One block, as forward runs it (public for the checkpointing function, which re-runs it in backward).
  at::Tensor run_block(int64_t layer, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    return block_forward(blocks[layer], x, cos, sin, nullptr, layer, 0);
  }
  // The same, run again in backward by activation checkpointing, counted: how a caller (and a test) sees that
  // checkpointing really recomputed rather than kept the activations.
  at::Tensor recompute_block(int64_t layer, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ++recomputed_blocks_;
    return run_block(layer, x, cos, sin);
  }
  int64_t recomputed_blocks() const { return recomputed_blocks_; }

  at::Tensor embed_tokens, final_norm;
  std::vector<Qwen3Block> blocks;

 private:
  at::Tensor block_forward(const Qwen3Block& b, at::Tensor x, const at::Tensor& cos, const at::Tensor& sin,
                           KVCache* cache, int64_t layer, int64_t offset);
  at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight) const;
  at::Tensor* field_of(const std::string& key);

  Qwen3Config config_;
  at::ScalarType dtype_;
  at::ScalarType compute_dtype_;
  at::Device device_;
  at::Tensor lm_head_;  // undefined when tied to embed_tokens
  ProjectionOp project_ = dense_projection;
  bool checkpoint_blocks_ = false;
  BlockGradientSink gradient_sink_;
  bool embedding_grad_in_place_ = false;
  int64_t recomputed_blocks_ = 0;
  std::vector<std::pair<std::string, at::Tensor*>> fields_;  // file key -> field, in file order
};

// Rotary embedding tables [T, head_dim] (fp32) for positions offset .. offset+T-1.
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t head_dim, double theta, int64_t offset, int64_t length,
                                              at::Device device);

// softmax(q kᵀ / sqrt(d) + mask) v with GQA: q [B, nh, T, d], k/v [B, nkv, S, d], query i sees keys
// j <= (S - T) + i. libtorch 2.x uses scaled_dot_product_attention; 1.13 the same math by hand.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

}  // namespace qwen3
