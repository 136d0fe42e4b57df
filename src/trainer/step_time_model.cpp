// The step-time model: FLOPs and bytes of each phase of one training step, turned into time. docs/performance.md.
#include "qwen3/trainer/step_time_model.h"

#include <algorithm>
#include <cmath>

#include "qwen3/base/error.h"
#include "qwen3/memory/memory_probe.h"
#include "qwen3/model/layout.h"
#include "qwen3/model/lm_loss.h"
#include "qwen3/model/model.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "qwen3/optim/optim.h"
#include "train_setup.h"

namespace qwen3 {
namespace {

constexpr double kCodeBytes = 9.0 / 16.0;  // NVFP4: half a byte of code and a 16th of a scale byte an element

// Adds work to a phase and to its term `name` (one term a name, in the order first counted): every flop and byte
// the model counts goes through here, so the terms add up to the phase.
void count(PhaseTime& p, const std::string& name, StepTerm::Kind kind, double flops, double bytes) {
  if (flops == 0 && bytes == 0) return;
  p.flops += flops, p.bytes += bytes;
  for (StepTerm& t : p.terms)
    if (t.name == name) {
      t.flops += flops, t.bytes += bytes;
      return;
    }
  p.terms.push_back({name, kind, flops, bytes, 0});
}
void products(PhaseTime& p, const std::string& name, double flops) { count(p, name, StepTerm::Kind::products, flops, 0); }
void pass(PhaseTime& p, const std::string& name, double bytes) { count(p, name, StepTerm::Kind::passes, 0, bytes); }

}  // namespace

const std::vector<std::string>& predict_device_names() {
  static const std::vector<std::string> names = {"h100", "h200", "gb10", "cpu"};
  return names;
}

DeviceRates device_rates(std::string_view name) {
  // GPUs: the vendors' dense peaks (H100/H200 SXM; GB10: 1 PFLOP FP4 with sparsity, halved for dense and
  // quartered for bf16, and ~31 TFLOPS fp32 as presented at Hot Chips 2025). Efficiencies and update rates:
  // measured on an H200 in the second GPU round, 2026-11-26 (docs/performance.md, "The second GPU round"): the
  // products of a Qwen3-4B step reached 60% of the bf16 peak, the fp32 update 85% of the bandwidth (112.6 GB in
  // 27.7 ms), and 55% for the other passes is what makes the model meet the measured steps of full rows (fast and
  // lean at 2048 × 1 unpacked, 512 × 4) within 1% (the first round's slower kernels fitted 35%); the update's
  // element rates are bench_kernels' adamw rows (G parameters/s): the plain kernel's from the second round, the
  // compressed moments' from the third (H200, 2026-11-27: int8 133.3 / 138.8, nvfp4 81.5 / 80.0 with an fp32 /
  // bf16 master, where the second round measured 69.6 / 94.9 and 62.1 / 57.3; the plain kernel, bound by its
  // bytes, ran at 97% of that machine's copy rate and is left at its faster machine's 147.9, a ceiling the byte
  // count reaches first); the plain update that writes the operand too, the third round's 89.8 G/s (fp32 moments,
  // bf16 master; 91.3 with an fp32 master, 89.5 and 94.5 with bf16 moments: 74% of a copy and below, where the
  // same kernel without it reached 97%; kept until a round times its own split of four elements a lane, 2026-11-28,
  // which static scaling puts near 126: kernels/adamw_step.md); the int8 and nvfp4 updates that write the operand,
  // not measured yet, estimated from their rates by the static machine instructions of the path a lane runs (sm_90, a lane's work
  // with write_operand in rne mode and without, compiled alone, kernels/adamw_step.md; the code of 2026-11-28): int8
  // 1,536 -> 1,856 with a bf16 master and gradient, 1,432 -> 1,768 with fp32 ones (138.8 -> 114.9, 133.3 -> 108.0);
  // nvfp4, both passes, 1,400 -> 1,592 and 1,336 -> 1,504 (80.0 -> 70.4, 81.5 -> 72.4). Static counts include the
  // reciprocal's slow path, which no real block runs: if anything too slow. The H100 has the H200's SMs and clocks:
  // the same fractions and element rates, assumed. GB10: the same fractions, and the element rates scaled by its 48 SMs
  // against 132, assumed. cpu: the development machine (dev-2c, its two cores), measured by bench_train_step's
  // BM_ProductRate: a [32, 2560] x [2560, 9728] product at 300 GFLOP/s in bf16 and 107 in fp32; memcpy 23.5
  // GiB/s; the product rates are already what a training-shaped product reaches, an elementwise ATen pass about
  // half of it; no element bound on its update (its loops are measured in bytes, docs/optim.md).
  const UpdateRates hopper{147.9, 133.3, 138.8, 81.5, 80.0, 89.8,
                           133.3 * 1432 / 1768, 138.8 * 1536 / 1856, 81.5 * 1336 / 1504, 80.0 * 1400 / 1592};
  const double gb10_share = 48.0 / 132.0;
  const UpdateRates gb10{hopper.plain * gb10_share,
                         hopper.int8_fp32_master * gb10_share,
                         hopper.int8_bf16_master * gb10_share,
                         hopper.nvfp4_fp32_master * gb10_share,
                         hopper.nvfp4_bf16_master * gb10_share,
                         hopper.plain_with_operand * gb10_share,
                         hopper.int8_fp32_master_with_operand * gb10_share,
                         hopper.int8_bf16_master_with_operand * gb10_share,
                         hopper.nvfp4_fp32_master_with_operand * gb10_share,
                         hopper.nvfp4_bf16_master_with_operand * gb10_share};
  if (name == "h100") return {"h100", 989.0, 67.0, 3350.0, 0.6, 0.85, false, 80.0, 0.55, hopper};
  if (name == "h200") return {"h200", 989.0, 67.0, 4800.0, 0.6, 0.85, false, 141.0, 0.55, hopper};
  if (name == "gb10") return {"gb10", 125.0, 31.0, 273.0, 0.6, 0.85, true, 128.0, 0.55, gb10};
  if (name == "cpu") return {"cpu", 0.300, 0.107, 25.2, 1.0, 0.5, false, 0.0, 0.5, UpdateRates{}};
  std::string known;
  for (const auto& n : predict_device_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError("--predict-device: unknown '" + std::string(name) + "' (" + known + ")");
}

double update_elements_per_s(const DeviceRates& device, MomentStorage moments, MasterDtype master,
                             bool writes_operand) {
  const bool bf16 = master == MasterDtype::bfloat16;
  const UpdateRates& u = device.update;
  switch (moments) {
    case MomentStorage::int8:
      if (writes_operand) return bf16 ? u.int8_bf16_master_with_operand : u.int8_fp32_master_with_operand;
      return bf16 ? u.int8_bf16_master : u.int8_fp32_master;
    case MomentStorage::nvfp4:
      if (writes_operand) return bf16 ? u.nvfp4_bf16_master_with_operand : u.nvfp4_fp32_master_with_operand;
      return bf16 ? u.nvfp4_bf16_master : u.nvfp4_fp32_master;
    default:
      return writes_operand ? u.plain_with_operand : u.plain;
  }
}

std::string rates_name_for_gpu(int major, int minor, uint64_t total_memory) {
  if (major == 12 && minor == 1) return "gb10";
  if (major == 9 && minor == 0 && total_memory > (uint64_t{100} << 30)) return "h200";
  return "h100";
}

std::string default_rates_name(const c10::Device& device) {
  if (!device.is_cuda()) return "cpu";
  const auto gpu = cuda_device_info(device);
  return gpu ? rates_name_for_gpu(gpu->major, gpu->minor, gpu->total_memory) : "h100";
}

double StepTimePlan::total_ms() const {
  double t = 0;
  for (const auto& p : phases) t += p.ms;
  return t;
}

double StepTimePlan::floor_ms() const {
  double flops = 0;
  for (const auto& p : phases) flops += p.flops;
  return matmul_flops_per_s > 0 ? 1e3 * flops / matmul_flops_per_s : 0;
}

StepTimePlan predict_step_time(const Qwen3Config& config, bool separate_head, const TrainOptions& o,
                               const DeviceRates& device, double attention_square) {
  const ModelShape s = config.shape();
  const bool gpu = device.name != "cpu";
  const c10::Device as_device = gpu ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  const double e = o.master_dtype == MasterDtype::bfloat16 ? 2 : 4;
  const bool compute_bf16 = train_detail::compute_scalar_type(o, as_device) == at::kBFloat16;
  const double a = compute_bf16 ? 2 : 4;
  const double B = static_cast<double>(o.data.batch_size), T = static_cast<double>(o.data.seq_len), N = B * T;
  const double H = s.hidden, Q = s.heads * s.head_dim, KV = s.kv_heads * s.head_dim, I = s.intermediate,
               V = s.vocab, nh = s.heads, hd = s.head_dim;

  // What trains, per block, and outside the blocks.
  std::vector<double> projections(s.layers, 0), trained_projections(s.layers, 0);
  // Of them, a sparse block's routed experts: on a GPU they run as grouped products (ste_grouped_linear), whose
  // forward writes every expert's codes with its operand wherever backward reads them and whose backward
  // dequantizes them; no operand is kept for them (--keep-weight-operands concerns the other projections).
  std::vector<double> trained_experts(s.layers, 0);
  // Of them, a dense block's trained down_proj: the recompute under --grad-checkpoint makes its node without the
  // product (nothing reads the block's output there; BlockOutput::differentiated, ProductOutput::unread).
  std::vector<double> trained_down(s.layers, 0);
  // A sparse block's products: a token goes through its k experts of E (and the router), so it multiplies by
  // k/E of the experts' elements; every expert's weights still move once a step (projections above).
  std::vector<double> active(s.layers, 0), trained_active(s.layers, 0);
  const double routed_share = s.experts > 0 ? static_cast<double>(config.num_experts_per_tok) / static_cast<double>(s.experts) : 1;
  std::vector<bool> block_trains(s.layers, false);
  double trainable = 0, trainable_in_blocks = 0;
  double state_bytes = 0, state_bytes_in_blocks = 0;  // both moments and their scales (the optimizer's own count)
  bool embedding_trains = false, head_trains = false;
  for (const auto& spec : qwen3_tensors(s, separate_head)) {
    double n = 1;
    for (int64_t d : spec.shape) n *= static_cast<double>(d);
    const bool trains = train_detail::is_trainable(spec.key, s.layers, o);
    const double state = trains ? static_cast<double>(moment_state_bytes(spec.shape, o.adamw.moments)) : 0;
    if (trains) trainable += n, state_bytes += state;
    if (spec.key.rfind("model.layers.", 0) == 0) {
      const int64_t l = std::stoll(spec.key.substr(13));
      if (trains) trainable_in_blocks += n, state_bytes_in_blocks += state;
      if (spec.quantizable) projections[l] += n, trained_projections[l] += trains ? n : 0;
      const bool expert = spec.key.find(".mlp.experts.") != std::string::npos;
      const bool router = spec.key.find(".mlp.gate.weight") != std::string::npos;
      if (spec.quantizable && expert && trains) trained_experts[l] += n;
      if (trains && !s.moe_layer(l) && spec.key.find(".mlp.down_proj.") != std::string::npos) trained_down[l] += n;
      if (spec.quantizable || router) {
        const double used = expert ? n * routed_share : n;
        active[l] += used;
        trained_active[l] += trains ? used : 0;
      }
      block_trains[l] = block_trains[l] || trains;
    } else if (trains) {
      embedding_trains = embedding_trains || spec.key == "model.embed_tokens.weight";
      head_trains = head_trains || spec.key == "lm_head.weight";
    }
  }
  int64_t first_graph_block = embedding_trains ? 0 : s.layers;
  for (int64_t l = 0; l < s.layers; ++l)
    if (block_trains[l]) first_graph_block = std::min(first_graph_block, l);
  const bool head_grad = head_trains || (embedding_trains && !separate_head);

  // Per block: the attention's products (causal: half of the T x T scores), the activations' elementwise
  // traffic per token, and the weight bytes a product moves besides its operands. On a GPU the activations'
  // passes are counted as the block runs them with the fused kernels (docs/performance.md, "The step-time
  // model"): forward the two norms (2H each), the q/k norms with RoPE (2(Q+KV): one pass, head_norm_rotary, where
  // the kernel takes the head width; else the norm and RoPE 2(Q+KV) each), the merged heads' copy (2Q: none where
  // the flash node runs attention, whose output is laid out [B, T, heads, d], flash_attention_takes), the two
  // residual adds (3H each), SwiGLU (3I); backward the two norms' dx and dw passes (5H each) and their reads of
  // the residual stream's gradient, which their dx kernels add in (1H each: rms_norm_and_input; autograd's sums
  // moved 3H each), the q/k norms with RoPE (3(Q+KV): dy and x read, dx written; else the norms' 5(Q+KV) and
  // RoPE's 2(Q+KV)), SwiGLU's (5I), the sums of q/k/v's and of gate/up's dX (6H and 3H: none where the projections
  // train, whose shared-input nodes add each dX into one buffer in the product, ste_linear_shared_input; a frozen
  // block's codes products still leave autograd to sum them), the heads' copy (2Q, or none as in forward). On CPU
  // libtorch's unfused ops: an estimate of their passes.
  const bool fused_qk = fused_head_norm_rope_takes(s.head_dim);
  const double qk_forward = fused_qk ? 2 : 4, qk_backward = fused_qk ? 3 : 7;
  const bool flash = flash_attention_takes(as_device, compute_bf16 ? at::kBFloat16 : at::kFloat, s.head_dim);
  const double heads_copy = flash ? 0 : 2 * Q;
  // Causal: half of each sequence's square of scores, twice two FLOPs a score (q·k, then p·v). Packed rows' samples
  // run alone through the flash node (a sum of their squares); elsewhere a row is one masked sequence of T.
  const double counted_square = flash && attention_square > 0 ? attention_square : B * T * T;
  const double attention_flops = 2 * nh * hd * counted_square;
  // A sparse block's MLP is k experts wide a token, and each routed row is gathered, and added back, once more.
  const double k = static_cast<double>(std::max<int64_t>(config.num_experts_per_tok, 1));
  const auto mlp_width = [&](int64_t l) { return s.moe_layer(l) ? k * static_cast<double>(s.expert_intermediate) : I; };
  const auto routed_rows = [&](int64_t l) { return s.moe_layer(l) ? k * H : 0.0; };
  const auto activation_bytes = [&](int64_t l) {
    const double w = mlp_width(l);
    return N * a * ((gpu ? 10 * H + qk_forward * (Q + KV) + heads_copy + 3 * w : 12 * H + 2 * (Q + 2 * KV) + 6 * w) + 4 * routed_rows(l));
  };
  const auto activation_backward_bytes = [&](int64_t l, bool trained) {
    const double dx_sums = trained ? 0 : 6 * H + (s.moe_layer(l) ? 0 : 3 * H);
    return gpu ? N * a * (12 * H + dx_sums + (s.moe_layer(l) ? 3 * H : 0) + qk_backward * (Q + KV) + heads_copy +
                          5 * mlp_width(l) + 6 * routed_rows(l))
               : 2 * activation_bytes(l);
  };
  // Below kNvfp4KernelMaxRows tokens on a GPU the NVFP4 kernel reads the codes (nothing else moves); from there a
  // trained weight's bf16 operand comes from one pass over its master (e + a: decoded from the codes in
  // registers, nvfp4_kernels.md), which writes the codes too only where backward keeps them (neither a
  // checkpointed block's first forward, which keeps nothing, nor a forward that keeps the operand); a frozen one's
  // operand is dequantized from its codes (codes + a). On CPU: an fp32 copy of the master, the codes, the fp32
  // dequantization and its typed copy.
  const bool kernel_product = gpu && compute_bf16 && N < static_cast<double>(nvfp4::kNvfp4KernelMaxRows);
  const bool one_pass_operand = gpu && compute_bf16 && !kernel_product;
  // dX's operand: dequantized from the codes (GPU: into the scratch), except where each trained projection keeps
  // its operand from the (re)computed forward (--keep-weight-operands, as predict() decides it; ste_linear's
  // keep_operand).
  const bool kept_operand = one_pass_operand && train_detail::keeps_weight_operands(o);
  // Operands in buffers of their own for the run: under --grad-checkpoint with backward the first forward makes
  // each (e + a) and the recompute none; with always the operand is the update's (a bytes an element written
  // beside the master, counted with the update below), so forward and the recompute make none: cuBLAS reads it.
  // Per block (--grad-checkpoint-blocks: the first blocks recomputed, the others keeping their graph).
  const auto recomputed = [&](int64_t l) { return train_detail::recomputes_block(o, l); };
  const auto held_operand = [&](int64_t l) {
    return kept_operand && train_detail::weight_operand_buffers_in_block(o, l);
  };
  const bool update_operand = kept_operand && train_detail::weight_operands_written_by_update(o);
  const double frozen_forward_per = kernel_product ? kCodeBytes : (gpu ? kCodeBytes + a : kCodeBytes + 4 + a);
  const auto trained_forward_per = [&](int64_t l) {
    return kernel_product     ? e + kCodeBytes + kCodeBytes
           : update_operand   ? 0
           : one_pass_operand ? e + a + (recomputed(l) || kept_operand ? 0 : kCodeBytes)
                              : e + kCodeBytes + kCodeBytes + 4 + a;
  };
  const auto trained_recompute_per = [&](int64_t l) { return held_operand(l) ? 0 : trained_forward_per(l); };
  const double dequantize_per = gpu ? kCodeBytes + a : kCodeBytes + 4 + a;

  PhaseTime forward, backward, optimizer;
  forward.phase = "forward_done", backward.phase = "backward_done", optimizer.phase = "optimizer_step_done";
  // The grouped experts on a GPU at training shapes: codes and operand from one pass (the codes where backward
  // reads them: not in a checkpointed block's first forward), dequantized again in backward.
  const bool grouped_experts = one_pass_operand;
  const auto expert_forward_per = [&](int64_t l, bool recorded) {
    return grouped_experts ? e + a + (recorded ? kCodeBytes : 0) : trained_forward_per(l);
  };
  for (int64_t l = 0; l < s.layers; ++l) {
    const double frozen = projections[l] - trained_projections[l];
    const double experts = grouped_experts ? trained_experts[l] : 0, others = trained_projections[l] - experts;
    // The block's forward (`prefix` "" or the recompute's): its products but `skipped` FLOPs, its passes, its trained
    // projections' operands at `trained_per` bytes an element, its activations' passes but `unread` bytes.
    const auto block_forward = [&](PhaseTime& p, const std::string& prefix, double trained_per, double skipped,
                                   double unread) {
      products(p, prefix + "projections", 2 * N * active[l] - skipped);
      products(p, prefix + "attention", attention_flops);
      pass(p, prefix + "frozen projections' operands", frozen * frozen_forward_per);
      pass(p, prefix + "trained projections' operands", others * trained_per);
      pass(p, prefix + "experts' codes and operands", experts * expert_forward_per(l, !recomputed(l)));
      pass(p, prefix + "activations", activation_bytes(l) - unread);
    };
    block_forward(forward, "", trained_forward_per(l), 0, 0);
    if (l < first_graph_block) continue;  // no graph, no backward
    products(backward, "projections' dX", 2 * N * active[l]);
    products(backward, "projections' dW", 2 * N * trained_active[l]);
    products(backward, "attention", 2 * attention_flops);
    // dX's operands, then dW written in the master's dtype.
    pass(backward, "dX operands dequantized",
         frozen * dequantize_per + others * (kept_operand ? 0 : dequantize_per) + experts * dequantize_per);
    pass(backward, "dW written", (others + experts) * e);
    pass(backward, "activations", activation_backward_bytes(l, others > 0));
    // The recompute: the block's forward again, whose one-pass operands write the codes where dX reads them (and
    // which makes no operand held from the first forward); a dense block without its last product (a trained
    // down_proj's) and the residual add after it (3H a token), whose outputs nothing reads.
    if (recomputed(l)) {
      block_forward(backward, "recompute: ", trained_recompute_per(l), 2 * N * trained_down[l],
                    s.moe_layer(l) ? 0 : N * a * 3 * H);
      pass(backward, "recompute: codes for dX",
           (one_pass_operand && !kept_operand ? others * kCodeBytes : 0) + experts * kCodeBytes);
    }
  }
  // The sliced loss: the head's product in forward; in backward the logits again, dX and (if it trains) dW.
  // Beyond the products: on a GPU each slice's logits are written by the product and read once by the statistics
  // kernel (forward), and written, then read and overwritten by the gradient kernel (backward): 2a and 3a bytes a
  // logit (kernels/lm_loss_slice.md); on CPU libtorch's fp32 passes, 2a + 28 and 3a + 32. The head is cast to the
  // compute dtype a slice at a time (read e, written a) where the master's dtype differs; where it is the compute
  // dtype the product reads it as it is (an operand, not a pass). Each slice's dX, an fp32 [N, H], is added to the
  // ones before it (the product's tensor and the sum read, the sum written: 12 bytes an element), slices of
  // lm_loss's width (loss_slice_width: 2^24 logits over the rows, in multiples of 128 columns).
  const double head_cast_bytes = a != e ? V * H * (e + a) : 0;
  const double forward_logit_bytes = N * V * (gpu ? 2 * a : 2 * a + 28);
  const double backward_logit_bytes = N * V * (gpu ? 3 * a : 3 * a + 32);
  const double slice = static_cast<double>(
      loss_slice_width(static_cast<int64_t>(N), static_cast<int64_t>(V)));
  const double input_gradient_sums = std::ceil(V / slice) * 12 * N * H;
  products(forward, "loss: head", 2 * N * H * V);
  pass(forward, "loss: head cast", head_cast_bytes);
  pass(forward, "loss: logits", forward_logit_bytes);
  products(backward, "loss: head (logits, dX, dW)", 2 * N * H * V * (head_grad ? 3 : 2));
  pass(backward, "loss: head cast", head_cast_bytes);
  pass(backward, "loss: logits", backward_logit_bytes);
  pass(backward, "loss: dX slices summed", input_gradient_sums);
  pass(backward, "loss: head gradient written", head_grad ? V * H * e : 0);
  // The optimizer: the norm reads every gradient once; the fused update reads gradient, master and state and
  // writes master and state (nvfp4 on a GPU reads the gradient and its state twice, for the row scale).
  // The norm is a kernel of its own (kernels/grad_clip.md), so its read is counted apart from the update's kernel,
  // at the memory rate whatever bounds that kernel: an update bound by its instructions does not hide it.
  const bool reread = gpu && o.adamw.moments == MomentStorage::nvfp4;
  const auto update_bytes = [&](double params, double state) {
    return params * (e /*grad*/ + 2 * e /*master*/ + (reread ? e : 0)) + state * (reread ? 3 : 2);
  };
  const auto norm_bytes = [&](double params) { return params * e; };
  // What any AdamW of this storage must move (gradient read, master and moments read and written; no norm pass,
  // no re-read): the memory floor of the update, beside the products' compute floor.
  const double update_floor_bytes = trainable * (e + 2 * e) + 2 * state_bytes;
  // --fused-optimizer: the blocks' updates run inside backward; the optimizer phase has the rest.
  const double in_backward = o.fused_optimizer ? 1 : 0;
  // --keep-weight-operands always: the update writes each trained projection's operand (the same state bytes an
  // element as the block's others).
  double operand_elements = 0;
  if (update_operand)
    for (int64_t l = 0; l < s.layers; ++l) operand_elements += trained_projections[l] - trained_experts[l];
  const double operand_update_bytes =
      operand_elements > 0
          ? update_bytes(operand_elements, state_bytes_in_blocks * operand_elements / trainable_in_blocks) +
                a * operand_elements
          : 0;
  backward.norm_bytes = in_backward * norm_bytes(trainable_in_blocks);
  backward.update_bytes =
      in_backward * (update_bytes(trainable_in_blocks, state_bytes_in_blocks) + a * operand_elements) + backward.norm_bytes;
  backward.updated = in_backward * trainable_in_blocks;
  backward.operand_updated = in_backward * operand_elements;
  backward.operand_update_bytes = in_backward * operand_update_bytes;
  count(backward, "gradient norm read", StepTerm::Kind::norm, 0, backward.norm_bytes);
  count(backward, "update", StepTerm::Kind::update, 0, backward.update_bytes - backward.norm_bytes);
  optimizer.norm_bytes = norm_bytes(trainable - in_backward * trainable_in_blocks);
  optimizer.update_bytes = update_bytes(trainable - in_backward * trainable_in_blocks, state_bytes - in_backward * state_bytes_in_blocks) +
                           (1 - in_backward) * a * operand_elements + optimizer.norm_bytes;
  optimizer.updated = trainable - in_backward * trainable_in_blocks;
  optimizer.operand_updated = (1 - in_backward) * operand_elements;
  optimizer.operand_update_bytes = (1 - in_backward) * operand_update_bytes;
  count(optimizer, "gradient norm read", StepTerm::Kind::norm, 0, optimizer.norm_bytes);
  count(optimizer, "update", StepTerm::Kind::update, 0, optimizer.update_bytes - optimizer.norm_bytes);

  const double matmul_rate = (compute_bf16 ? device.bf16_tflops : device.fp32_tflops) * 1e12 * device.matmul_efficiency;
  const double memory_rate = device.memory_gbps * 1e9 * device.memory_efficiency;
  const double pass_rate = device.memory_gbps * 1e9 * device.pass_efficiency;
  const double element_rate = 1e9 * update_elements_per_s(device, o.adamw.moments, o.master_dtype);
  const double operand_rate = 1e9 * update_elements_per_s(device, o.adamw.moments, o.master_dtype, true);
  // Each kernel at the slower of its bytes and its elements: the operand-writing updates apart from the others.
  const auto bound = [&](double bytes, double elements, double rate) {
    return std::max(bytes / memory_rate, rate > 0 ? elements / rate : 0.0);
  };
  StepTimePlan plan{device.name, {forward, backward, optimizer}, matmul_rate};
  for (PhaseTime& p : plan.phases) {
    const double norm_s = p.norm_bytes / memory_rate;
    const double update_s =
        bound(p.update_bytes - p.norm_bytes - p.operand_update_bytes, p.updated - p.operand_updated, element_rate) +
        bound(p.operand_update_bytes, p.operand_updated, operand_rate);
    // Each term at its kind's rate; the phase is their sum (a phase has one norm term and one update term).
    p.ms = 0;
    for (StepTerm& t : p.terms) {
      t.ms = 1e3 * (t.kind == StepTerm::Kind::products ? t.flops / matmul_rate
                    : t.kind == StepTerm::Kind::passes ? t.bytes / pass_rate
                    : t.kind == StepTerm::Kind::norm   ? norm_s
                                                       : update_s);
      p.ms += t.ms;
    }
  }
  plan.update_floor_ms = 1e3 * update_floor_bytes / memory_rate;
  plan.attention_square = counted_square, plan.whole_rows_square = B * T * T;
  return plan;
}

bool updates_bound_by_bytes(const StepTimePlan& plan, const TrainOptions& o, const DeviceRates& device) {
  const double memory_rate = device.memory_gbps * 1e9 * device.memory_efficiency;
  const double element_rate = 1e9 * update_elements_per_s(device, o.adamw.moments, o.master_dtype);
  const double operand_rate = 1e9 * update_elements_per_s(device, o.adamw.moments, o.master_dtype, true);
  for (const PhaseTime& p : plan.phases) {
    const double bytes = p.update_bytes - p.norm_bytes - p.operand_update_bytes;
    const double elements = p.updated - p.operand_updated;
    if (element_rate > 0 && elements / element_rate > bytes / memory_rate) return false;
    if (operand_rate > 0 && p.operand_updated / operand_rate > p.operand_update_bytes / memory_rate) return false;
  }
  return true;
}

double model_flops_per_token(const Qwen3Config& c, int64_t seq_len) {
  // The parameters a token's products use: the layout's tensors with a head of their own (a tied head is the
  // embedding, counted once as the head), less the input embedding, whose lookup is no product; of a sparse
  // block's experts only the k a token goes through (k/E of them: the "active" parameters).
  const ModelShape s = c.shape();
  const double routed_share = s.experts > 0 ? static_cast<double>(c.num_experts_per_tok) / static_cast<double>(s.experts) : 1;
  double parameters = 0;
  for (const auto& spec : qwen3_tensors(s, /*with_lm_head=*/true)) {
    if (spec.key == "model.embed_tokens.weight") continue;
    double n = 1;
    for (int64_t d : spec.shape) n *= static_cast<double>(d);
    parameters += spec.key.find(".mlp.experts.") != std::string::npos ? n * routed_share : n;
  }
  const double attention_width = static_cast<double>(s.heads * s.head_dim);
  return 6 * parameters + 12 * static_cast<double>(s.layers) * attention_width * static_cast<double>(seq_len);
}

}  // namespace qwen3
