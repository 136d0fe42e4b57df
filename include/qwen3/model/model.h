// The Qwen3 causal LM as docs/model.md computes it. The model knows nothing of quantization or of training
// policy: each projection is a `Projection` (a dense weight and the kernel that multiplies by it) whose kernel
// the trainer swaps (the NVFP4 straight-through linear for trained weights, a product from codes for frozen
// ones, whose dense weight then goes), and how blocks run while training (activation checkpointing, the
// optimizer in backward) is a `BlockRunner` the trainer owns.
#pragma once
#include <ATen/core/Tensor.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "qwen3/config/config.h"

namespace qwen3 {

struct Projection;

// Rows sorted by group for a grouped product (a mixture-of-experts block's tokens by expert): group g owns the
// counts[g] rows ending at ends[g]. `ends` int32 [G] on the rows' device (what a grouped GEMM reads), `counts`
// the same sizes on the host.
struct RowGroups {
  at::Tensor ends;
  std::vector<int64_t> counts;
};

// How a projection multiplies: y = x · wᵀ for x [..., in]. `weight` is the projection's dense weight [out, in],
// undefined when the kernel holds the weight in a form of its own.
class ProjectionKernel {
 public:
  virtual ~ProjectionKernel() = default;
  virtual at::Tensor apply(const at::Tensor& x, const at::Tensor& weight) const = 0;
  // apply's node where nobody reads the output, only differentiates it (a dense block's last product when the
  // block runs again to be differentiated, BlockOutput::differentiated): the same saved tensors and backward; a
  // kernel may leave the product itself out, the output's bytes then unspecified. By default apply.
  virtual at::Tensor apply_unread(const at::Tensor& x, const at::Tensor& weight) const { return apply(x, weight); }
  // Several projections at once over rows sorted by projection (a sparse block's experts; every kernel of
  // `group` is of this kernel's type): the rows of group g times projection g's matrix, [rows, out], one node.
  // Offered where it is the faster form (one grouped GEMM for all experts on CUDA); where not, the model runs
  // one product per projection.
  virtual bool offers_grouped(const at::Tensor& rows) const { return false; }
  virtual at::Tensor apply_grouped(const std::vector<const Projection*>& group, const at::Tensor& rows,
                                   const RowGroups& groups) const;
  // Several projections of one input x (a block's q, k and v; its gate and up; every kernel of `group` of this
  // kernel's type): projection i's output [..., out_i] each, from one node, where that is the faster form (one
  // buffer for the input's gradient, which each product adds into, instead of a sum a projection). Where not
  // offered, the model runs one product per projection.
  virtual bool offers_shared_input(const at::Tensor& x) const { return false; }
  virtual std::vector<at::Tensor> apply_shared_input(const std::vector<const Projection*>& group,
                                                     const at::Tensor& x) const;
};

// One projection: its dense weight (what loading fills and the optimizer trains; undefined once a kernel
// holding another form replaced it) and its kernel (none: the dense product in the activations' dtype).
struct Projection {
  at::Tensor weight;
  std::shared_ptr<const ProjectionKernel> kernel;
  at::Tensor operator()(const at::Tensor& x) const;
  // The same node for an output nobody reads (ProjectionKernel::apply_unread).
  at::Tensor unread(const at::Tensor& x) const;
};

// What a block's caller does with its output: reads it (every forward), or only differentiates it (a block run
// again in backward by activation checkpointing: the next block's input was kept from the first run, so the
// output's value is read by nothing and its graph alone matters). A dense block run for `differentiated` leaves
// out its last product (down_proj's, where its kernel may: apply_unread) and the residual add after it; its
// output's bytes are then unspecified, its gradients the same.
enum class BlockOutput { read, differentiated };

// The projections of `group` (not empty) over one input x, in order: one shared-input node where their kernels
// (all of one type) offer it for x, else one product each.
std::vector<at::Tensor> project_shared_input(const std::vector<const Projection*>& group, const at::Tensor& x);

// Post-RoPE keys and values per layer, unexpanded [B, kv_heads, capacity, head_dim]; `length` positions used.
struct KVCache {
  std::vector<at::Tensor> keys, values;
  int64_t length = 0;
  int64_t capacity() const { return keys.empty() ? 0 : keys[0].size(2); }
};

// One expert of a sparse block: a SwiGLU MLP of width moe_intermediate_size.
struct ExpertMlp {
  Projection gate_proj, up_proj, down_proj;
};

struct Qwen3Block {
  Projection q_proj, k_proj, v_proj, o_proj;
  at::Tensor q_norm, k_norm;
  Projection gate_proj, up_proj, down_proj;  // the dense MLP; unused in a sparse block
  at::Tensor router;                         // a sparse block's mlp.gate.weight [experts, hidden], never quantized
  std::vector<ExpertMlp> experts;            // a sparse block's experts; empty in a dense block
  at::Tensor input_layernorm, post_attention_layernorm;

  bool sparse() const { return !experts.empty(); }
  // The block's tensors in file order (docs/model.md): eleven in a dense block, 9 + 3 a expert in a sparse one;
  // the model maps file keys to them by name (Qwen3Model::field_of). A projection whose kernel holds its
  // weight gives an undefined tensor.
  std::vector<const at::Tensor*> tensors() const;
  // Its projections in file order: 7 in a dense block, 4 + 3 an expert in a sparse one (the router is none).
  std::vector<Projection*> projections();
};

class Qwen3Model;

// Several sequences packed into each row: each position's offset in its own sequence (RoPE restarts with every
// sequence) and which sequence of the row it belongs to (attention stays within it), int64 [B, T] each.
struct PackedRows {
  at::Tensor positions, documents;
};

// How hidden_states runs the blocks while autograd records (training): the model calls the runner for each
// block instead of running it itself, and the runner calls Qwen3Model::run_block when and as often as it
// chooses (once in forward, again in backward for activation checkpointing) and may route the block's
// gradients elsewhere. Without a runner, or under a KV cache or no-grad, the model runs blocks directly.
class BlockRunner {
 public:
  virtual ~BlockRunner() = default;
  // `allowed`: how packed rows attend (packed_attention_layout), undefined for plain causal rows.
  virtual at::Tensor run(Qwen3Model& model, int64_t layer, const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin, const at::Tensor& allowed) = 0;
};

// Sees each sparse block's router logits [tokens, experts] as a forward computes them and returns what the block
// routes with: the same values, possibly wrapped in an autograd node (the trainer's load-balancing loss adds its
// gradient that way, trainer/router_balance.h). Called again for a block that a runner recomputes. The model
// knows nothing of what the observer does.
class RouterObserver {
 public:
  virtual ~RouterObserver() = default;
  virtual at::Tensor observe(int64_t layer, const at::Tensor& router_logits) = 0;
};

class Qwen3Model {
 public:
  // Weights are allocated uninitialized in `dtype` on `device`; load_weights fills them.
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

  // Every block projection in file order (7 a dense block, 4 + 3 an expert a sparse one): where the trainer
  // swaps kernels.
  std::vector<Projection*> projections();
  // Set for training, cleared (nullptr) after; the runner must outlive every backward of a forward it ran.
  void set_block_runner(BlockRunner* runner) { block_runner_ = runner; }

  // The token embeddings [B, T, H] of ids, in the compute dtype.
  at::Tensor embed(const at::Tensor& ids) const;
  // The blocks and the final norm over embeddings x [B, T, H] (hidden_states(ids) is this over embed(ids)):
  // for a caller that looks the embeddings up its own way. `packed` (no cache): rows of several sequences.
  at::Tensor hidden_states_from_embeddings(at::Tensor x, KVCache* cache = nullptr, const PackedRows* packed = nullptr);
  // One block without a cache, as forward runs it: what a BlockRunner calls.
  at::Tensor run_block(int64_t layer, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& allowed, BlockOutput output = BlockOutput::read) {
    return block_forward(blocks[static_cast<size_t>(layer)], x, cos, sin, nullptr, layer, 0, allowed, output);
  }

  // The sparse blocks' router logits [tokens, experts] of each forward while recording (the load-balancing loss
  // needs them, load_balancing_loss in lm_loss.h), in block order; take_router_logits hands them over and
  // empties the list. Off by default: inference and evaluation keep nothing.
  void set_router_logits_recording(bool on) { record_router_logits_ = on; }
  std::vector<at::Tensor> take_router_logits() { return std::move(router_logits_); }
  // Set for a training forward, cleared (nullptr) after; must outlive every backward of a forward it saw.
  void set_router_observer(RouterObserver* observer) { router_observer_ = observer; }

  // A block's MLP over its normed input h [..., H]: the dense SwiGLU, or the sparse block's routed experts
  // (moe_mlp). Public for the tests' dense re-computation of the routing.
  at::Tensor mlp(const Qwen3Block& b, const at::Tensor& h) const;

  at::Tensor embed_tokens, final_norm;
  std::vector<Qwen3Block> blocks;

 private:
  at::Tensor moe_mlp(const Qwen3Block& b, const at::Tensor& h) const;
  at::Tensor block_forward(const Qwen3Block& b, at::Tensor x, const at::Tensor& cos, const at::Tensor& sin,
                           KVCache* cache, int64_t layer, int64_t offset, const at::Tensor& allowed,
                           BlockOutput output = BlockOutput::read);
  at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight) const;
  at::Tensor* field_of(const std::string& key);

  Qwen3Config config_;
  at::ScalarType dtype_;
  at::ScalarType compute_dtype_;
  at::Device device_;
  at::Tensor lm_head_;  // undefined when tied to embed_tokens
  BlockRunner* block_runner_ = nullptr;
  bool record_router_logits_ = false;
  RouterObserver* router_observer_ = nullptr;
  mutable std::vector<at::Tensor> router_logits_;  // recorded by moe_mlp (const: a forward changes no weight)
  std::vector<std::pair<std::string, at::Tensor*>> fields_;  // file key -> field, in file order
};

// Whether the q and k norms and RoPE run as one fused pass each way on CUDA for heads of this width (16, 32, 64,
// 128, 256: kernels/fused_ops.md), whatever this build has: the step-time model counts the GPU path by it.
bool fused_head_norm_rope_takes(int64_t head_dim);

// Rotary embedding tables [T, head_dim] (fp32) for positions offset .. offset+T-1.
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t head_dim, double theta, int64_t offset, int64_t length,
                                              at::Device device);
// The same for explicit positions [B, T]: tables [B, T, head_dim], equal to the above where they agree.
std::pair<at::Tensor, at::Tensor> rope_tables_at(int64_t head_dim, double theta, const at::Tensor& positions);
// The attention mask of packed rows [B, 1, T, T]: query i sees key j <= i of its own document.
at::Tensor packed_attention_mask(const at::Tensor& documents);
// The segments of packed rows as a variable-length attention kernel takes them: the rows [B, T] flattened, a
// segment for each run of one document id in a row (a run of padding is one too), int32 [segments + 1] offsets
// from 0 to B·T. documents: int64 [B, T] on the CPU.
at::Tensor packed_segment_offsets(const at::Tensor& documents);
// The longest segment of such offsets (0 for none).
int64_t longest_segment(const at::Tensor& offsets);
// The sum of the squared lengths of packed rows' segments (as packed_segment_offsets makes them): what the flash
// node's causal attention over them costs, against B·T² for rows attending whole. documents: int64 [B, T], CPU.
double packed_attention_square(const at::Tensor& documents);
// What attention gets for packed rows: where flash_attention_takes (and the libtorch is a CUDA 2.x), the
// segment offsets (on the host, pinned: attention copies them to the device and sizes the kernel by the longest
// segment), so each sample runs alone through the variable-length flash kernel; else the mask [B, 1, T, T] on
// `device`. documents: int64 [B, T] on any device.
at::Tensor packed_attention_layout(const at::Tensor& documents, at::Device device, at::ScalarType dtype,
                                   int64_t head_dim);
// Whether causal attention, of dense rows and of packed ones, runs as the flash node of a CUDA libtorch 2.x
// (attention.cpp): the flash kernel's own conditions, a CUDA device, bf16/fp16 activations and a head width that
// is a multiple of 8 up to 256 (the kernel refuses others). Its output is [B, T, heads, d] in memory, so the
// block merges the heads for o_proj as a view, and its backward gives the same bytes every run. The memory and
// step-time models ask this for a GPU they predict from any build (taking its libtorch to be 2.x).
bool flash_attention_takes(at::Device device, at::ScalarType dtype, int64_t head_dim);
// Whether this build's SDPA takes grouped key/value heads without copies (enable_gqa, libtorch 2.5+); causal
// attention without a mask then hands it k and v as they are.
bool sdpa_takes_grouped_heads();

// softmax(q kᵀ / sqrt(d) + mask) v with GQA: q [B, nh, T, d], k/v [B, nkv, S, d], query i sees keys
// j <= (S - T) + i, or, given `allowed` (packed rows, T == S), the keys it allows: a bool mask [B, 1, T, S], or
// int32 segment offsets (packed_segment_offsets; CUDA, libtorch 2.x), where each segment attends causally within
// itself. libtorch 2.x uses scaled_dot_product_attention (or the variable-length flash kernel); 1.13 the same
// math by hand.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed = {});

}  // namespace qwen3
