// The step's memory, simulated: a running count of live tensor bytes that allocates and frees what the trainer's
// phases allocate and free, with the short-lived temporaries of each operation as spikes above it.
#include "qwen3/trainer/memory_model.h"

#include <torch/version.h>

#include <algorithm>

#include "qwen3/model/layout.h"
#include "qwen3/model/lm_loss.h"
#include "qwen3/model/model.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "qwen3/optim/optim.h"
#include "train_setup.h"

namespace qwen3 {
namespace {

using u64 = uint64_t;

class Timeline {
 public:
  void add(u64 bytes) { now_ += bytes, peak_ = std::max(peak_, now_); }
  void sub(u64 bytes) { now_ -= std::min(now_, bytes); }
  void spike(u64 bytes) { peak_ = std::max(peak_, now_ + bytes); }
  PhaseMemory close(const std::string& phase) {
    PhaseMemory p{phase, peak_, now_};
    peak_ = now_;
    return p;
  }

 private:
  u64 now_ = 0, peak_ = 0;
};

// Bytes per element of an optimizer piece that the step allocates besides its state: the fused update
// (kernels/adamw_update.cuh) allocates nothing, so what remains is the gradient norm's, formed piece by piece
// (square_sum_fp32): an fp32 copy of a bf16 gradient and its square.
u64 optimizer_temp_per_element(bool bf16_master) { return bf16_master ? 8 : 4; }

struct BlockSizes {
  u64 projections = 0;      // elements of the seven projection matrices
  u64 trained_projections = 0;
  u64 trained_experts = 0;  // of them, a sparse block's routed experts
  u64 largest_projection = 0;
  u64 parameters = 0;       // every element of the block
  u64 trainable = 0;        // elements that train
  // Activations (count_activations): what autograd keeps per token, and the MLP's short-lived tensors, which
  // differ between a dense block and a sparse (mixture-of-experts) one.
  u64 saved_per_token = 0, mlp_saved = 0, mlp_temp = 0, mlp_forward_temp = 0, backward_activation_temp = 0;
};

}  // namespace

bool build_uses_sdpa() { return TORCH_VERSION_MAJOR >= 2; }

u64 StepMemoryPlan::peak() const {
  u64 p = 0;
  for (const auto& phase : phases) p = std::max(p, phase.peak);
  return p;
}

namespace {

// Everything the phases need, counted once from the configuration and the options.
struct StepSizes {
  const TrainOptions& o;
  ModelShape s;
  bool separate_head = false, cuda = false, sdpa = false;
  u64 e = 4, a = 4;         // master and activation bytes an element
  bool bf16 = false, abf16 = false;
  u64 B = 0, T = 0, N = 0, H = 0, Q = 0, KV = 0, I = 0, V = 0, nh = 0;
  int64_t experts_per_token = 0;  // a MoE model's k
  bool grouped = false, kv_copies = false;
  // Whether our flash attention node runs attention (a CUDA device, flash_attention_takes; attention.cpp). Its
  // output is [B, T, heads, d] in memory, so the merged heads o_proj saves are a view of it (elsewhere a copy);
  // its deterministic backward adds dq into an fp32 workspace a split.
  bool flash_node = false;
  std::vector<BlockSizes> blocks;
  u64 weights = 0, moments = 0, gradients = 0;  // the plan's totals
  u64 largest_dense = 0, largest_quantized = 0, nonblock_grad = 0, dense_weights = 0, largest_frozen = 0;
  bool embedding_trains = false, head_trains = false;
  u64 optimizer_piece_max = 0, nonblock_piece_max = 0;
  int64_t first_graph_block = 0;  // autograd records nothing before the first tensor that trains
  u64 scratch = 0;                // a GPU's reused dequantization buffer (nvfp4_linear.h)
  bool scratch_in_forward = false;
  // CUDA training at the one-pass shapes with --keep-weight-operands (checkpointed with recompute: each
  // recompute's operands until its block's backward; else every trained projection's from its forward to its
  // backward, which under checkpointing with backward is a buffer each for the run).
  bool kept_operands = false;
  // always, and backward in a block --grad-checkpoint recomputes: buffers for the run (weight_operand_buffers_in_block)
  std::vector<bool> operand_buffers;
  u64 operand_weights = 0;  // their bytes, allocated after loading, counted in the plan's weights
  // What autograd keeps of one block per token, and the short-lived activations (docs/memory.md).
  u64 attention_forward_temp = 0;
  u64 width = 0;  // the cross-entropy's vocabulary slice

  static constexpr u64 kFlashSms = 132;
  static constexpr u64 kCodesPerElementX16 = 9;  // 8 bits of codes + 1 byte of scale per 16 elements: 9/16 byte

  StepSizes(const Qwen3Config& config, bool separate, const TrainOptions& options, const c10::Device& device,
            bool uses_sdpa)
      : o(options), s(config.shape()), separate_head(separate), cuda(device.is_cuda()), sdpa(uses_sdpa) {
    e = o.master_dtype == MasterDtype::bfloat16 ? 2 : 4;
    bf16 = e == 2;
    a = train_detail::compute_scalar_type(o, device) == at::kBFloat16 ? 2 : 4;
    abf16 = a == 2;
    B = static_cast<u64>(o.data.batch_size), T = static_cast<u64>(o.data.seq_len), N = B * T;
    H = s.hidden, Q = s.heads * s.head_dim, KV = s.kv_heads * s.head_dim, I = s.intermediate, V = s.vocab;
    nh = s.heads;
    experts_per_token = config.num_experts_per_tok;
    grouped = s.heads != s.kv_heads;
    // causal_attention (attention.cpp) hands the grouped k and v as they are to SDPA where it can (libtorch 2.5+,
    // or a CUDA device, whose libtorch is taken to be the GPU machine's 2.x) and rows are not packed (a mask), and
    // to the flash node on CUDA in bf16, packed rows included (flash_attention_takes); else each query head gets a
    // copy of its group's k and v, and those copies are what autograd saves.
    const bool flash =
        flash_attention_takes(device, abf16 ? at::kBFloat16 : at::kFloat, static_cast<int64_t>(s.head_dim));
    kv_copies = grouped && !(sdpa && (cuda || sdpa_takes_grouped_heads()) && (!o.data.pack || flash));
    flash_node = sdpa && flash;
    count_tensors(device);
    count_activations();
  }

  // The model's tensors, the blocks' sizes, what trains.
  void count_tensors(const c10::Device& device) {
    blocks.assign(s.layers, BlockSizes{});
    for (const auto& spec : qwen3_tensors(s, separate_head)) {
      u64 n = 1;
      for (int64_t d : spec.shape) n *= static_cast<u64>(d);
      const bool trains = train_detail::is_trainable(spec.key, s.layers, o);
      const std::optional<int64_t> layer = layer_of_key(spec.key);
      const bool block_projection = spec.quantizable && layer.has_value();
      // Frozen block projections are held as their codes once loaded (train_setup.h).
      const bool as_codes = block_projection && !trains && o.frozen_projections_as_codes;
      dense_weights += n * e;
      weights += as_codes ? n * 9 / 16 : n * e;
      if (as_codes) largest_frozen = std::max(largest_frozen, n);
      const int64_t rows = spec.shape[0], cols = spec.shape.size() > 1 ? spec.shape[1] : 1;
      const u64 piece = static_cast<u64>(optimizer_piece_rows(o.adamw.step_chunk_rows, rows, cols, device)) * cols;
      if (trains) {
        moments += moment_state_bytes(spec.shape, o.adamw.moments);
        gradients += n * e;
        optimizer_piece_max = std::max(optimizer_piece_max, piece);
      }
      if (layer) {
        BlockSizes& b = blocks[static_cast<size_t>(*layer)];
        b.parameters += n;
        if (trains) b.trainable += n;
        if (spec.quantizable) b.projections += n, b.largest_projection = std::max(b.largest_projection, n);
        if (spec.quantizable && trains) b.trained_projections += n;
        if (spec.quantizable && trains && spec.key.find(".mlp.experts.") != std::string::npos) b.trained_experts += n;
      } else if (trains) {
        nonblock_grad += n * e;
        nonblock_piece_max = std::max(nonblock_piece_max, piece);
        if (spec.key == "model.embed_tokens.weight") embedding_trains = true;
        if (spec.key == "lm_head.weight") head_trains = true;
      }
      if (spec.quantizable) largest_quantized = std::max(largest_quantized, n);
      else largest_dense = std::max(largest_dense, n);
    }
    first_graph_block = embedding_trains ? 0 : s.layers;
    for (int64_t l = s.layers - 1; l >= 0; --l)
      if (blocks[l].trainable > 0 && l < first_graph_block) first_graph_block = l;
    u64 largest_block_projection = 0;
    for (const BlockSizes& b : blocks) largest_block_projection = std::max(largest_block_projection, b.largest_projection);
    // Held from the first product that needs it: in forward from kNvfp4KernelMaxRows tokens on (below, the
    // kernel reads the codes), else from the first backward.
    scratch = cuda ? a * largest_block_projection : 0;
    scratch_in_forward = cuda && (N >= static_cast<u64>(nvfp4::kNvfp4KernelMaxRows) || !abf16);
    kept_operands = train_detail::keeps_weight_operands(o) && cuda && abf16 &&
                    N >= static_cast<u64>(nvfp4::kNvfp4KernelMaxRows);
    operand_buffers.assign(s.layers, false);
    for (int64_t l = 0; l < s.layers; ++l) {  // the operand of each trained projection of the block, for the run
      operand_buffers[l] = kept_operands && train_detail::weight_operand_buffers_in_block(o, l);
      if (operand_buffers[l]) operand_weights += 2 * (blocks[l].trained_projections - blocks[l].trained_experts);
    }
  }

  void count_activations() {
    // On CUDA the fused kernels (activation_ops.cpp) run the norms and SwiGLU: RMSNorm saves its input and a
    // per-row fp32 rstd, its output being the next projection's saved input; the q/k norms the same, their output
    // going on into RoPE (which saves only its tables) and attention; SwiGLU saves gate and up, its product being
    // down_proj's saved input. libtorch's ops (CPU) keep more: an fp32 copy of a norm's input, the normed value,
    // silu(gate). The first GPU round (Qwen3-4B, fp32 master, no checkpointing) measured the CUDA counts: 60 KB a
    // token a block fewer than the CPU counts, the 4.4 GiB by which the prediction had been high.
    const bool fused = cuda;
    const u64 norm_saved = fused ? 2 * a * H + 4 : (4 + 2 * a) * H + 4;  // (fp32 copy,) input, output; rstd
    const u64 qk_saved = (fused ? a : 4 + a) * (Q + KV) + 4 * (nh + s.kv_heads);
    u64 attention_saved = a * Q /*q after RoPE*/ + (flash_node ? 0 : a * Q /*the merged heads, copied*/);
    if (sdpa) {  // flash attention (CUDA, and PyTorch 2.x's CPU kernel): output and log-sum-exp, no scores
      attention_saved += (kv_copies ? 2 * a * Q : 2 * a * KV) + a * Q /*output*/ + 4 * nh /*log-sum-exp*/;
    } else {
      attention_saved += (kv_copies ? 2 * a * Q : 2 * a * KV) + 4 * nh * T + (abf16 ? 2 * nh * T : 0);
    }
    const u64 k = static_cast<u64>(std::max<int64_t>(experts_per_token, 1)), E = s.experts, Ie = s.expert_intermediate;
    // Attention scores [B, heads, T, T]: with the explicit softmax two fp32 copies are alive at once in forward
    // (scores and masked, or probabilities and their typed copy) and two gradients in backward; a GPU's fused
    // attention has none (nor PyTorch 2.x's CPU flash kernel, which works in per-thread tiles). The MLP: gate,
    // up and silu outputs (forward without a graph, below); in backward the gradient from down_proj and the two
    // it makes (gate's, up's), less the product saved for down_proj, freed by then: two [N, I] tensors net.
    const bool explicit_scores = !sdpa;
    const u64 scores = B * nh * T * T;
    attention_forward_temp = explicit_scores ? scores * 8 : 0;
    // The flash node's deterministic backward: an fp32 [splits, N, heads, d] workspace for dq, the splits
    // ceil(SMs / (B · heads)) (libtorch's flash kernel) at the H100's and H200's 132 SMs.
    const u64 flash_splits = flash_node ? (kFlashSms + B * nh - 1) / (B * nh) : 0;
    const u64 attention_backward_temp = explicit_scores ? scores * 8 : N * 3 * a * Q + flash_splits * N * 4 * Q;
    for (int64_t l = 0; l < s.layers; ++l) {
      BlockSizes& b = blocks[static_cast<size_t>(l)];
      // A sparse block runs each token through k experts of width moe_intermediate_size: the dense block's
      // tensors at width k·Ie per token, plus the routing (fp32 probabilities [N, E], the top k's indices and
      // weights) and, per (token, expert), its gathered input row and its output, saved for the weighting.
      const bool sparse = s.moe_layer(l);
      const u64 width = sparse ? k * Ie : I;
      const u64 routing_saved = sparse ? 4 * E + k * (8 + 4 + 4 + a) + 2 * k * a * H : 0;
      // gate, up, their product (+ silu(gate) with libtorch's ops) (+ the routing)
      b.mlp_saved = (fused ? 3 : 4) * a * width + routing_saved;
      b.saved_per_token = 2 * norm_saved + qk_saved + attention_saved + b.mlp_saved;
      // Forward without a graph: the block's residual and normed input, gate and up, then silu(gate) and its
      // product with up at once on CPU (four [N, I] tensors; the CUDA kernel makes the product directly: three).
      // Backward: the gradient from down_proj and the two it makes, less the product saved for down_proj; for a
      // sparse block, beside the gradients of the output and of the gathered input.
      if (!sparse) {
        b.mlp_forward_temp = N * a * ((cuda ? 3 : 4) * I + 2 * H);
        b.mlp_temp = N * 2 * a * width;
      } else if (cuda) {
        // The experts as grouped products (model.cpp, experts_grouped; a CUDA run is taken to have the GPU
        // machine's PyTorch wheel, 2.8+): all N·k rows at once — the input repeated k times and gathered (2 H),
        // gate, up and their product (3 Ie), the weighted output and its ranked copy (2 H) — and one projection
        // kind's operands of all E experts [E, Ie, H] for its product. Backward: the gradients of those rows, all
        // experts' operands dequantized at once and the stacked weight gradient [E, Ie, H] before each expert's
        // is cast.
        const u64 operands = E * Ie * H * a;
        b.mlp_forward_temp = N * (a * 3 * H + 4 * E) + N * k * a * (4 * H + 3 * Ie) + operands;
        b.mlp_temp = N * 2 * a * H + N * k * a * (2 * Ie + 2 * H) + 2 * operands;
      } else {
        // One expert after another: besides the output it accumulates and the routing, only one expert's rows and
        // temporaries alive at a time, the busiest expert's share taken as twice the average (N·k/E tokens an
        // expert).
        const u64 busiest = std::min<u64>(N, 2 * N * k / std::max<u64>(E, 1));
        b.mlp_forward_temp = N * (a * 3 * H + 4 * E) + busiest * a * (4 * Ie + 2 * H);
        b.mlp_temp = N * 2 * a * H + busiest * 2 * a * Ie;
      }
      // Backward of a block: the MLP's part runs first; by the time attention's runs, its saved tensors are gone.
      b.backward_activation_temp = std::max(
          b.mlp_temp, attention_backward_temp > b.mlp_saved * N ? attention_backward_temp - b.mlp_saved * N : 0);
    }
    width = static_cast<u64>(loss_slice_width(static_cast<int64_t>(N), static_cast<int64_t>(V)));
  }

  // What a block's trained projections keep for their dX: their codes, or their bf16 operands where they are kept
  // until backward, except a sparse block's experts on CUDA, whose grouped products save the codes whatever the
  // flag (ste_grouped_linear); nothing beyond that for operands kept across steps (counted with the weights).
  bool recomputes(int64_t layer) const { return train_detail::recomputes_block(o, layer); }
  u64 codes_for_dx(const BlockSizes& b) const {
    return (kept_operands ? b.trained_experts : b.trained_projections) * kCodesPerElementX16 / 16;
  }
  u64 operands_for_dx(int64_t layer) const {
    const BlockSizes& b = blocks[layer];
    return kept_operands && !operand_buffers[layer] ? (b.trained_projections - b.trained_experts) * 2 : 0;
  }
  u64 kept_for_dx(int64_t layer) const { return codes_for_dx(blocks[layer]) + operands_for_dx(layer); }

  // The straight-through linear's temporaries for a projection of n elements: on CPU the weight is quantized
  // from an fp32 copy and dequantized (to fp32, then the compute dtype) for the product; on a GPU the kernel
  // reads the codes directly in forward and backward dequantizes once, into the scratch buffer.
  u64 projection_forward_temp(u64 n) const {
    const u64 codes = n * kCodesPerElementX16 / 16;
    if (cuda) return codes;
    return codes + std::max(bf16 ? 4 * n : 0, 4 * n + (abf16 ? 2 * n : 0));
  }
  u64 projection_backward_temp(u64 n) const { return cuda ? 0 : 4 * n + (abf16 ? 2 * n : 0); }
};

// Loading: all tensors allocated, then each filled from a file read (and dequantized) into temporaries; then
// the frozen projections are quantized (from an fp32 copy) and their dense storage released.
void load_phase(const StepSizes& z, DenseFileType dense_file, Timeline& t) {
  t.add(z.dense_weights);
  const u64 dense_load_temp = z.largest_dense * (dense_file.bytes + (dense_file.is_master_dtype ? 0 : z.e));
  const u64 quantized_load_temp = z.largest_quantized * (StepSizes::kCodesPerElementX16 * 1 + 64 + (z.bf16 ? 32 : 0)) / 16;
  t.spike(std::max(dense_load_temp, quantized_load_temp));
  t.spike(z.largest_frozen * (z.bf16 ? 4 : 0) + z.largest_frozen * 9 / 16);
  t.sub(z.dense_weights - z.weights);
  t.add(z.operand_weights);
}

// Forward: returns what each block keeps for backward; adds the plan's saved activations and codes.
std::vector<u64> forward_phase(const StepSizes& z, Timeline& t, StepMemoryPlan& plan) {
  const u64 a = z.a, N = z.N, H = z.H;
  // RoPE tables, the embedded input (looked up in the master dtype, then cast to the compute dtype)
  t.add(2 * 4 * z.T * z.s.head_dim + a * N * H);
  if (a != z.e) t.spike(z.e * N * H);
  if (z.scratch_in_forward) t.add(z.scratch);
  std::vector<u64> saved(z.s.layers);
  for (int64_t l = 0; l < z.s.layers; ++l) {
    const BlockSizes& b = z.blocks[l];
    // What a trained projection keeps for its dX (frozen ones hold their codes already): its codes, or its bf16
    // operand (--keep-weight-operands).
    const u64 for_dx = z.kept_for_dx(l);
    const bool checkpoint = z.recomputes(l);
    const u64 temp = z.projection_forward_temp(b.largest_projection) + z.attention_forward_temp;
    // Without a graph (frozen blocks ahead of the first trained tensor, checkpointed blocks) the block's q, k, v
    // (and their expanded copies) and norm outputs are short-lived too.
    const u64 attention_inputs = N * (a * (3 * z.Q + 2 * z.KV) + (4 + 2 * a) * H);
    if (l < z.first_graph_block) {
      // All of its projections are frozen codes: only the product's dequantization on CPU.
      const u64 product = z.cuda ? 0 : (4 + (z.abf16 ? 2 : 0)) * b.largest_projection;
      saved[l] = 0;
      t.spike(std::max(product + z.attention_forward_temp + attention_inputs, product + b.mlp_forward_temp));
      continue;
    }
    if (checkpoint) {
      t.spike(std::max(temp + attention_inputs, b.mlp_forward_temp + z.projection_forward_temp(b.largest_projection)));
      saved[l] = a * N * H;  // the block's input alone
    } else {
      // (With --fused-optimizer the block runner hands on the block's output itself, no copy: block_runner.cpp.)
      saved[l] = b.saved_per_token * N + for_dx;
      t.spike(saved[l] + temp);
    }
    t.add(saved[l]);
    plan.saved_activations += saved[l];
    if (!checkpoint) plan.saved_codes += z.codes_for_dx(b), plan.saved_operands += z.operands_for_dx(l);
  }
  return saved;
}

u64 final_norm_saved(const StepSizes& z) { return (4 + 2 * z.a) * z.N * z.H + 4 * z.N; }

// The loss: cross-entropy over vocabulary slices, or the original's L1 to the target embeddings.
void loss_forward_phase(const StepSizes& z, Timeline& t) {
  const u64 a = z.a, N = z.N, H = z.H;
  t.add(final_norm_saved(z));
  if (z.o.loss == LossKind::cross_entropy) {
    t.add(4 * N);  // log-sum-exp
    // A slice's logits (and, on CPU, their fp32 copy, shifted, exp; on CUDA one kernel reads the logits only:
    // kernels/lm_loss_slice.md); the head's slice cast to the compute dtype.
    const u64 per_logit = z.cuda ? a : a + (z.abf16 ? 4 : 0) + 2 * 4;
    t.spike(N * z.width * per_logit + (a != z.e ? z.width * H * a : 0));
  } else {
    t.spike(N * H * (a + 3 * 4));
    t.add(8 * N * H);
  }
}

// Ranks sharing the optimizer state (--shard-optimizer-state); 1 otherwise.
u64 state_shards(const StepSizes& z) {
  return z.o.shard_optimizer_state ? static_cast<u64>(std::max<int64_t>(1, z.o.predict_world_size)) : 1;
}

// The gradients alive when backward ends: all of them (plain), those outside the blocks (fused: the blocks' are
// applied and freed), or a rank's share (shared-out state, plain: each gradient is summed onto its owner and the
// other ranks drop it; shares are dealt by tensor, so "a share" is 1/N within one tensor).
u64 gradients_held_after_backward(const StepSizes& z) {
  if (z.o.fused_optimizer) return z.nonblock_grad;
  const u64 shards = state_shards(z);
  return shards > 1 ? (z.gradients + shards - 1) / shards : z.gradients;
}

// Backward: the loss (the head's weight gradient is always formed), the final norm, the blocks last to first,
// the embedding.
void backward_phase(const StepSizes& z, const std::vector<u64>& saved, Timeline& t) {
  const u64 a = z.a, N = z.N, H = z.H, e = z.e;
  if (z.o.loss == LossKind::cross_entropy) {
    // The head's gradient goes straight into its .grad() (slice by slice, no [V, H] temporary); a frozen head
    // gets none.
    const bool head_grad = z.head_trains || (z.embedding_trains && !z.separate_head);
    if (head_grad) t.add(z.V * H * e);
    // A slice's logits and their gradient (CPU: fp32 exp, then the typed copy; CUDA: written over the logits),
    // the fp32 dX and its product.
    const u64 per_logit = z.cuda ? a : a + 8 + (z.abf16 ? 2 : 0);
    t.spike(N * z.width * per_logit + 4 * N * H + (a != e ? 2 * z.width * H * a : 0));
  }
  t.spike(3 * 4 * N * H);
  t.sub(final_norm_saved(z));
  if (z.cuda && !z.scratch_in_forward) t.add(z.scratch);
  const u64 opt_temp_per_element = optimizer_temp_per_element(z.bf16);
  // Shared-out state, plain update: a block keeps its share once the next block's gradients arrive (the sums of
  // the one before are waited for then), so the previous block's other shares are alive with this one's.
  const u64 shards = z.o.fused_optimizer ? 1 : state_shards(z);
  u64 in_flight = 0;
  for (int64_t l = z.s.layers - 1; l >= z.first_graph_block; --l) {
    const BlockSizes& b = z.blocks[l];
    const u64 grads = b.trainable * e;
    u64 temp = z.projection_backward_temp(b.largest_projection) + b.backward_activation_temp + grads + in_flight;
    // Checkpointed: the recompute's saved tensors; each trained projection keeps its bf16 product operand where
    // the CUDA quantize pass makes one (nvfp4::ste_linear's keep_operand; none beyond the run's buffer where it
    // has one), else its codes.
    if (z.recomputes(l))
      temp += b.saved_per_token * N + z.kept_for_dx(l);
    t.spike(temp);
    // Fused: the block's update runs after its graph is gone, with only the gradients and a piece's temporaries.
    const u64 update_working_set =
        grads + std::min<u64>(b.largest_projection, z.optimizer_piece_max) * opt_temp_per_element;
    if (z.o.fused_optimizer) t.spike(update_working_set);
    if (!z.o.fused_optimizer) t.add(grads / shards);
    in_flight = grads - grads / shards;
    // --overlap-update: the block's update runs on its own stream beside the next block's backward, so its
    // gradients and temporaries are alive (the allocator keeps them for that stream) through that block's spike:
    // counted as the whole of them, the most one block ahead leaves alive.
    if (z.o.fused_optimizer && z.o.overlap_update && z.cuda) in_flight = update_working_set;
    t.sub(saved[l]);
  }
  t.sub(a * N * H);
  // The lookup adds its rows into the embedding's .grad() in place (allocated here unless the head's made it).
  if (z.embedding_trains && !(!z.separate_head && z.o.loss == LossKind::cross_entropy)) t.add(z.V * H * e);
  // Shared-out: the gradients outside the blocks are summed onto their owners at the end, the others dropped.
  if (shards > 1) t.sub(z.nonblock_grad - z.nonblock_grad / shards);
}

// The optimizer (and, fused, the tensors outside the blocks), then the gradients go.
void optimizer_phase(const StepSizes& z, Timeline& t) {
  const u64 pieces = z.o.fused_optimizer ? z.nonblock_piece_max : z.optimizer_piece_max;
  t.spike(pieces * optimizer_temp_per_element(z.bf16));
  t.sub(gradients_held_after_backward(z));
}

}  // namespace

// The trainer's phases in its order, each a function above.
StepMemoryPlan predict_step_memory(const Qwen3Config& config, bool separate_head, const TrainOptions& o,
                                   const c10::Device& device, DenseFileType dense_file, bool sdpa) {
  const StepSizes z(config, separate_head, o, device, sdpa);
  StepMemoryPlan plan;
  plan.weights = z.weights + z.operand_weights;
  // --shard-optimizer-state: a rank holds its share of the moments (shares balanced to within one tensor).
  const u64 shards = state_shards(z);
  plan.moments = (z.moments + shards - 1) / shards;
  plan.gradients = z.gradients;
  Timeline t;
  plan.phases.push_back(t.close("start"));
  load_phase(z, dense_file, t);
  plan.phases.push_back(t.close("model_loaded"));
  t.add(plan.moments);  // every state tensor allocated up front
  plan.phases.push_back(t.close("optimizer_state_ready"));
  t.add(2 * 8 * z.N);  // input and target ids
  plan.phases.push_back(t.close("batch_ready"));
  const std::vector<u64> saved = forward_phase(z, t, plan);
  loss_forward_phase(z, t);
  plan.phases.push_back(t.close("forward_done"));
  backward_phase(z, saved, t);
  plan.phases.push_back(t.close("backward_done"));
  optimizer_phase(z, t);
  plan.phases.push_back(t.close("optimizer_step_done"));
  return plan;
}

}  // namespace qwen3
