// The step-time model: the devices it knows, how its FLOPs and bytes respond to the flags that change the work,
// and the CLI that prints it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_util.h"
#include "qwen3/base/error.h"
#include "qwen3/config/config.h"
#include "qwen3/model/layout.h"
#include "qwen3/model/model.h"
#include "qwen3/trainer/step_time_model.h"

namespace qwen3 {
namespace {

Qwen3Config qwen3_4b() {
  Qwen3Config c = preset_config("qwen3-4b");
  c.validate("test");
  return c;
}

TrainOptions options(int64_t seq_len, int64_t batch = 1) {
  TrainOptions o;
  o.data.seq_len = seq_len;
  o.data.batch_size = batch;
  o.master_dtype = MasterDtype::bfloat16;
  o.adamw.moments = MomentStorage::int8;
  return o;
}

const PhaseTime& phase(const StepTimePlan& p, const std::string& name) {
  for (const auto& ph : p.phases)
    if (ph.phase == name) return ph;
  throw Error("no phase " + name);
}

TEST(StepTimeModel, KnowsItsDevicesAndRefusesOthers) {
  for (const auto& name : predict_device_names()) {
    const DeviceRates r = device_rates(name);
    EXPECT_EQ(r.name, name);
    EXPECT_GT(r.bf16_tflops, 0);
    EXPECT_GT(r.memory_gbps, 0);
  }
  EXPECT_TRUE(device_rates("gb10").unified_memory);
  EXPECT_THROW(device_rates("tpu"), UsageError);
}

TEST(StepTimeModel, ForwardFlopsAreTheProductsOfTheTokens) {
  const Qwen3Config c = qwen3_4b();
  const ModelShape s = c.shape();
  const StepTimePlan p = predict_step_time(c, false, options(2048), device_rates("h100"));
  // 2 N (projection parameters) + the head's 2 N H V + causal attention's 2 B heads T^2 head_dim per layer.
  double projections = 0;
  for (const auto& spec : qwen3_tensors(s, false))
    if (spec.quantizable && spec.key.rfind("model.layers.", 0) == 0)
      projections += static_cast<double>(spec.shape[0]) * static_cast<double>(spec.shape[1]);
  const double N = 2048;
  const double expected = 2 * N * projections + 2 * N * s.hidden * s.vocab +
                          s.layers * 2.0 * s.heads * N * N * s.head_dim;
  EXPECT_NEAR(phase(p, "forward_done").flops, expected, 1e-9 * expected);
  // The floor: every phase's products at the H100's 989 TFLOPS times 0.6, no bytes.
  const double all_flops = phase(p, "forward_done").flops + phase(p, "backward_done").flops +
                           phase(p, "optimizer_step_done").flops;
  EXPECT_NEAR(p.floor_ms(), 1e3 * all_flops / (989e12 * 0.6), 1e-9 * p.floor_ms());
  EXPECT_LT(p.floor_ms(), p.total_ms());
  // A full-parameter backward: dX and dW of every projection, twice the attention, the head three times.
  EXPECT_GT(phase(p, "backward_done").flops, 1.9 * phase(p, "forward_done").flops);
}

TEST(StepTimeModel, RespondsToTheFlagsThatChangeTheWork) {
  const Qwen3Config c = qwen3_4b();
  const DeviceRates h100 = device_rates("h100");
  const StepTimePlan base = predict_step_time(c, false, options(512), h100);
  // Twice the batch: twice every product (attention is per sequence).
  const StepTimePlan twice = predict_step_time(c, false, options(512, 2), h100);
  EXPECT_NEAR(phase(twice, "forward_done").flops, 2 * phase(base, "forward_done").flops, 1e-6);
  // Checkpointing recomputes each block's forward in backward, but for its last product (down_proj's, whose
  // output nothing reads there: BlockOutput::differentiated).
  TrainOptions ckpt = options(512);
  ckpt.grad_checkpoint = true;
  const StepTimePlan recomputed = predict_step_time(c, false, ckpt, h100);
  const double head_forward = 2.0 * 512 * c.hidden_size * c.vocab_size;
  const double down_forward = c.num_hidden_layers * 2.0 * 512 * c.hidden_size * c.intermediate_size;
  EXPECT_NEAR(phase(recomputed, "backward_done").flops - phase(base, "backward_done").flops,
              phase(base, "forward_done").flops - head_forward - down_forward, 1.0);
  // The last 8 layers: less backward, the same forward.
  TrainOptions last = options(512);
  last.train_last_layers = 8;
  const StepTimePlan partial = predict_step_time(c, false, last, h100);
  EXPECT_EQ(phase(partial, "forward_done").flops, phase(base, "forward_done").flops);
  EXPECT_LT(phase(partial, "backward_done").flops, 0.4 * phase(base, "backward_done").flops);
  // Smaller moments move fewer bytes; the fused optimizer moves the blocks' updates into backward.
  TrainOptions fp32_moments = options(512);
  fp32_moments.adamw.moments = MomentStorage::float32;
  EXPECT_GT(phase(predict_step_time(c, false, fp32_moments, h100), "optimizer_step_done").bytes,
            1.5 * phase(base, "optimizer_step_done").bytes);
  TrainOptions fused = options(512);
  fused.fused_optimizer = true;
  const StepTimePlan in_backward = predict_step_time(c, false, fused, h100);
  EXPECT_LT(phase(in_backward, "optimizer_step_done").bytes, 0.2 * phase(base, "optimizer_step_done").bytes);
  EXPECT_NEAR(phase(in_backward, "backward_done").bytes + phase(in_backward, "optimizer_step_done").bytes,
              phase(base, "backward_done").bytes + phase(base, "optimizer_step_done").bytes, 1.0);
  // More bandwidth, same work: never slower (an update bound by its element rate, the same SMs, takes as long).
  const StepTimePlan h200 = predict_step_time(c, false, options(512), device_rates("h200"));
  for (size_t i = 0; i < base.phases.size(); ++i) {
    EXPECT_EQ(h200.phases[i].flops, base.phases[i].flops);
    EXPECT_LE(h200.phases[i].ms, base.phases[i].ms);
  }
  EXPECT_LT(h200.total_ms(), base.total_ms());
  // fp32 compute on a GPU runs at the fp32 rate: much slower.
  TrainOptions fp32_compute = options(512);
  fp32_compute.compute_dtype = ComputeDtype::float32;
  EXPECT_GT(phase(predict_step_time(c, false, fp32_compute, h100), "forward_done").ms,
            5 * phase(base, "forward_done").ms);
}

// The bytes the code moves, term by term, at 2048 tokens on a GPU (bf16 compute, bf16 master, int8 moments):
// the loss kernels' 2 and 3 bytes-per-logit passes against the CPU's libtorch ones, the one-pass operand (codes
// written only where backward keeps them), the kept operand under checkpointing or --keep-weight-operands, the
// update's own floor.
TEST(StepTimeModel, CountsTheBytesTheGpuPathMoves) {
  const Qwen3Config c = qwen3_4b();
  const ModelShape s = c.shape();
  const DeviceRates h100 = device_rates("h100");
  double trained = 0, all = 0, state = 0;
  for (const auto& spec : qwen3_tensors(s, false)) {
    double n = 1;
    for (int64_t d : spec.shape) n *= static_cast<double>(d);
    all += n;
    if (spec.quantizable) trained += n;
    state += static_cast<double>(moment_state_bytes(spec.shape, MomentStorage::int8));
  }
  const double N = 2048, a = 2, e = 2, codes = 9.0 / 16, H = s.hidden, V = s.vocab, Q = s.heads * s.head_dim,
               KV = s.kv_heads * s.head_dim, I = s.intermediate;
  const StepTimePlan plain = predict_step_time(c, false, options(2048), h100);
  // Forward: each trained projection's operand from its master, codes kept; the activations' passes as counted
  // (the q/k norms and RoPE one pass: 2(Q+KV); no copy to merge the heads, the flash node's output being laid out
  // [B, T, heads, d]); the head's cast and the loss's 2 bytes a logit.
  ASSERT_TRUE(flash_attention_takes(at::kCUDA, at::kBFloat16, s.head_dim));
  const double activations = s.layers * N * a * (10 * H + 2 * (Q + KV) + 3 * I);
  // A bf16 master is the compute dtype: the head's slices are read by their products as they are (no cast).
  const double forward = trained * (e + codes + a) + activations + N * V * 2 * a;
  EXPECT_NEAR(phase(plain, "forward_done").bytes, forward, 1e-9 * forward);
  {
    // An fp32 master: its one pass reads 4 bytes an element, and the head is cast a slice at a time (4 read, 2
    // written), in forward and again in backward.
    TrainOptions fp32_master = options(2048);
    fp32_master.master_dtype = MasterDtype::float32;
    const StepTimePlan p = predict_step_time(c, false, fp32_master, h100);
    EXPECT_NEAR(phase(p, "forward_done").bytes - forward, trained * 2 + V * H * 6, 1e3);
  }
  {
    // Heads of 132 (not 8-element pieces in a power of two): the norm and RoPE as two passes each way, 2(Q+KV)
    // more forward and 4(Q+KV) more backward, and (not a multiple of 8: no flash node) the merged heads copied
    // each way (2Q), at the same weights' bytes.
    Qwen3Config wide = c;
    wide.head_dim = 132;
    const ModelShape w = wide.shape();
    ASSERT_FALSE(fused_head_norm_rope_takes(132));
    ASSERT_FALSE(flash_attention_takes(at::kCUDA, at::kBFloat16, 132));
    ASSERT_TRUE(fused_head_norm_rope_takes(s.head_dim));
    const double Qw = w.heads * w.head_dim, KVw = w.kv_heads * w.head_dim;
    double trained_w = 0;
    for (const auto& spec : qwen3_tensors(w, false))
      if (spec.quantizable) trained_w += static_cast<double>(spec.shape[0] * spec.shape[1]);
    const StepTimePlan unfused = predict_step_time(wide, false, options(2048), h100);
    const double forward_w = trained_w * (e + codes + a) + w.layers * N * a * (10 * H + 4 * (Qw + KVw) + 2 * Qw + 3 * I) +
                             N * V * 2 * a;
    EXPECT_NEAR(phase(unfused, "forward_done").bytes, forward_w, 1e-9 * forward_w);
    // Backward beside the fused width's: the activations' 12H (the norms' 10H and their reads of the stream's
    // gradient 2H; no sums of q/k/v's or gate/up's dX: the shared-input nodes add them in the products) + q/k (3 or
    // 7)(Q+KV) (+ 2Q where the heads' merge copied) + 5I, the weights' dX operands and dW in proportion to the
    // projections.
    const double backward_acts = s.layers * N * a * (12 * H + 3 * (Q + KV) + 5 * I);
    const double backward_acts_w = w.layers * N * a * (12 * H + 7 * (Qw + KVw) + 2 * Qw + 5 * I);
    const double weights = phase(plain, "backward_done").bytes - phase(plain, "backward_done").update_bytes - backward_acts;
    const double weights_w =
        phase(unfused, "backward_done").bytes - phase(unfused, "backward_done").update_bytes - backward_acts_w;
    // The loss's backward: the head's gradient written (V·H·e), 3a bytes a logit, and each of the 19 slices' fp32
    // dX added to the sum before it (12 bytes an element of [N, H]: 2^24 logits a slice, 8,192 columns at 2048 rows).
    const double sums = std::ceil(V / 8192.0) * 12 * N * H;
    EXPECT_NEAR(weights - V * H * e - N * V * 3 * a - sums, trained * (codes + a + e), 1e3);
    EXPECT_NEAR(weights_w - V * H * e - N * V * 3 * a - sums, trained_w * (codes + a + e), 1e3);
  }
  // Checkpointed: no codes in either forward, and dX reads the kept operand (no dequantization).
  TrainOptions ckpt = options(2048);
  ckpt.grad_checkpoint = true;
  const StepTimePlan recomputed = predict_step_time(c, false, ckpt, h100);
  EXPECT_NEAR(phase(plain, "forward_done").bytes - phase(recomputed, "forward_done").bytes, trained * codes, 1e3);
  const double backward_plain = phase(plain, "backward_done").bytes;
  const double backward_ckpt = phase(recomputed, "backward_done").bytes;
  // The recompute: forward's bytes again but the loss's, the operands' codes and dX's dequantization (dX reads the
  // recompute's operand), and each block's last residual add (3H a token: its output is read by nothing).
  EXPECT_NEAR(backward_ckpt - backward_plain, phase(recomputed, "forward_done").bytes - N * V * 2 * a -
                                                  trained * (codes + a) - s.layers * N * a * 3 * H,
              1e3);
  // --keep-weight-operands without checkpointing: forward writes no codes, and dX reads the kept operand.
  TrainOptions kept = options(2048);
  kept.keep_weight_operands = KeepWeightOperands::backward;
  const StepTimePlan kept_plan = predict_step_time(c, false, kept, h100);
  EXPECT_NEAR(phase(plain, "forward_done").bytes - phase(kept_plan, "forward_done").bytes, trained * codes, 1e3);
  EXPECT_NEAR(backward_plain - phase(kept_plan, "backward_done").bytes, trained * (codes + a), 1e3);
  // Kept across steps (always): forward makes no operand at all (e + a + codes less), dX reads it as above, and the
  // update writes it (a bytes an element more in the optimizer phase).
  TrainOptions always = options(2048);
  always.keep_weight_operands = KeepWeightOperands::always;
  const StepTimePlan always_plan = predict_step_time(c, false, always, h100);
  EXPECT_NEAR(phase(plain, "forward_done").bytes - phase(always_plan, "forward_done").bytes, trained * (e + a + codes),
              1e3);
  EXPECT_NEAR(phase(always_plan, "backward_done").bytes, phase(kept_plan, "backward_done").bytes, 1e3);
  EXPECT_NEAR(phase(always_plan, "optimizer_step_done").update_bytes -
                  phase(plain, "optimizer_step_done").update_bytes,
              trained * a, 1e3);
  // Checkpointed with the first forward's operands held through the recompute (backward): the recompute makes
  // none (master read and operand written: e + a bytes an element less), forward and the update as before.
  ckpt.keep_weight_operands = KeepWeightOperands::backward;
  const StepTimePlan held = predict_step_time(c, false, ckpt, h100);
  EXPECT_NEAR(phase(held, "forward_done").bytes, phase(recomputed, "forward_done").bytes, 1e3);
  EXPECT_NEAR(backward_ckpt - phase(held, "backward_done").bytes, trained * (e + a), 1e3);
  EXPECT_NEAR(phase(held, "backward_done").update_bytes, phase(recomputed, "backward_done").update_bytes, 1e3);
  // Checkpointed with the codes kept instead: the recompute writes them and dX dequantizes them.
  ckpt.keep_weight_operands = KeepWeightOperands::off;
  EXPECT_NEAR(phase(predict_step_time(c, false, ckpt, h100), "backward_done").bytes - backward_ckpt,
              trained * (codes + codes + a), 1e3);
  // The update's floor: gradient read, master read and written, both moments read and written.
  EXPECT_NEAR(plain.update_floor_ms, 1e3 * (all * 3 * e + 2 * state) / (3350e9 * 0.85), 1e-9 * plain.update_floor_ms);
  // On CPU the loss moves libtorch's fp32 passes: far more per logit (fp32 compute: a CPU without bf16 products
  // refuses bf16).
  TrainOptions cpu_options = options(2048);
  cpu_options.compute_dtype = ComputeDtype::float32;
  const StepTimePlan cpu = predict_step_time(c, false, cpu_options, device_rates("cpu"));
  EXPECT_GT(phase(cpu, "forward_done").bytes - phase(plain, "forward_done").bytes, N * V * 20);
}

// A sparse block's experts on a GPU run as grouped products, which write their codes in the (re)computed forward and
// dequantize them in backward whatever --keep-weight-operands says: keeping the recompute's operands takes from
// Qwen3-30B-A3B's checkpointed step only the other projections' codes (the recompute's) and dequantization, never
// the experts'; holding the first forward's through the recompute takes the other projections' operand pass from
// the recompute too (master read, operand written), never the experts'.
TEST(StepTimeModel, GroupedExpertsAlwaysMoveTheirCodes) {
  const Qwen3Config c = preset_config("qwen3-30b-a3b");
  double others = 0, experts = 0;
  for (const auto& spec : qwen3_tensors(c.shape(), !c.tie_word_embeddings)) {
    if (!spec.quantizable || spec.key.rfind("model.layers.", 0) != 0) continue;
    double n = 1;
    for (int64_t d : spec.shape) n *= static_cast<double>(d);
    (spec.key.find(".mlp.experts.") != std::string::npos ? experts : others) += n;
  }
  ASSERT_GT(experts, 10 * others);
  TrainOptions o = options(2048);
  o.adamw.moments = MomentStorage::nvfp4;
  o.grad_checkpoint = true;
  o.fused_optimizer = true;
  o.keep_weight_operands = KeepWeightOperands::off;
  const DeviceRates h200 = device_rates("h200");
  const double codes_bytes = phase(predict_step_time(c, !c.tie_word_embeddings, o, h200), "backward_done").bytes;
  o.keep_weight_operands = KeepWeightOperands::recompute;
  const StepTimePlan kept = predict_step_time(c, !c.tie_word_embeddings, o, h200);
  const double kept_bytes = phase(kept, "backward_done").bytes;
  const double code = 9.0 / 16, a = 2, e = 2;  // a bf16 master
  EXPECT_NEAR(codes_bytes - kept_bytes, others * (code + code + a), 1e3);
  o.keep_weight_operands = KeepWeightOperands::backward;
  const StepTimePlan held = predict_step_time(c, !c.tie_word_embeddings, o, h200);
  EXPECT_NEAR(kept_bytes - phase(held, "backward_done").bytes, others * (e + a), 1e3);
  EXPECT_EQ(phase(held, "forward_done").bytes, phase(kept, "forward_done").bytes);
}

// The rates the GPU rounds measured (H200): products at 60% of the bf16 peak, the update at 85% of the
// bandwidth unless its element rate is slower (the compressed moments' arithmetic: 80.0 G parameters/s for nvfp4
// moments with a bf16 master, the third round), every other pass at 55%.
TEST(StepTimeModel, TheUpdateRunsAtTheSlowerOfItsBytesAndItsElementRate) {
  const Qwen3Config c = qwen3_4b();
  const DeviceRates h200 = device_rates("h200");
  TrainOptions lean = options(2048);
  lean.adamw.moments = MomentStorage::nvfp4;
  lean.grad_checkpoint = true;
  lean.fused_optimizer = true;
  const StepTimePlan p = predict_step_time(c, false, lean, h200);
  const PhaseTime& opt = phase(p, "optimizer_step_done");
  const PhaseTime& bwd = phase(p, "backward_done");
  ASSERT_GT(opt.updated, 0);
  EXPECT_NEAR(opt.updated + bwd.updated, 4022468096.0, 1.0) << "every parameter is stepped once";
  EXPECT_GT(opt.updated / 80.0e9, opt.update_bytes / (4800e9 * 0.85)) << "nvfp4 moments: bound by arithmetic";
  // The gradient norm is a kernel of its own: its read (2 bytes a bf16 gradient) adds to the update's time at the
  // memory rate, not hidden inside the update's arithmetic bound.
  EXPECT_NEAR(opt.norm_bytes, 2.0 * opt.updated, 1.0);
  EXPECT_NEAR(opt.ms, 1e3 * (opt.norm_bytes / (4800e9 * 0.85) + opt.updated / 80.0e9), 1e-9 * opt.ms);
  EXPECT_NEAR(bwd.ms,
              1e3 * (bwd.flops / (989e12 * 0.6) + (bwd.bytes - bwd.update_bytes) / (4800e9 * 0.55) +
                     bwd.norm_bytes / (4800e9 * 0.85) + bwd.updated / 80.0e9),
              1e-9 * bwd.ms);
  const PhaseTime& fwd = phase(p, "forward_done");
  EXPECT_EQ(fwd.update_bytes, 0);
  EXPECT_NEAR(fwd.ms, 1e3 * (fwd.flops / (989e12 * 0.6) + fwd.bytes / (4800e9 * 0.55)), 1e-9 * fwd.ms);
  // fp32 master and moments: 28 bytes a parameter at 4.08 TB/s is 146 G/s, below the 147.9 G/s the plain kernel
  // reaches: bound by its bytes.
  TrainOptions fast = options(2048);
  fast.master_dtype = MasterDtype::float32;
  fast.adamw.moments = MomentStorage::float32;
  const StepTimePlan fast_plan = predict_step_time(c, false, fast, h200);  // phase() refers into the plan
  const PhaseTime& plain = phase(fast_plan, "optimizer_step_done");
  EXPECT_NEAR(plain.ms, 1e3 * plain.update_bytes / (4800e9 * 0.85), 1e-9 * plain.ms);
  EXPECT_EQ(update_elements_per_s(h200, MomentStorage::int8, MasterDtype::bfloat16), 138.8);
  // --keep-weight-operands always: the projections' updates write their operand too, at the operand-writing
  // kernel's element rate (89.8 G/s), slower than their 30 bytes an element allow; the other parameters' update
  // is bound by its bytes as before. The third round measured always 1.011x slower than auto at 512 x 4.
  TrainOptions always = fast;
  always.keep_weight_operands = KeepWeightOperands::always;
  const StepTimePlan always_plan = predict_step_time(c, false, always, h200);
  const PhaseTime& with_operand = phase(always_plan, "optimizer_step_done");
  ASSERT_GT(with_operand.operand_updated, 3e9);
  EXPECT_LT(with_operand.operand_updated, with_operand.updated);
  EXPECT_GT(with_operand.operand_updated / 89.8e9, with_operand.operand_update_bytes / (4800e9 * 0.85));
  EXPECT_NEAR(with_operand.ms,
              1e3 * ((with_operand.update_bytes - with_operand.operand_update_bytes) / (4800e9 * 0.85) +  // norm included
                     with_operand.operand_updated / 89.8e9),
              1e-9 * with_operand.ms);
  EXPECT_GT(with_operand.ms, plain.ms * 1.25) << "the operand's update counted at its bytes alone";
  EXPECT_EQ(update_elements_per_s(device_rates("cpu"), MomentStorage::nvfp4, MasterDtype::bfloat16), 0.0);
  // With int8 moments the operand-writing update runs at the int8 kernel's own rate with the operand (estimated
  // from the lane path's instructions until a round measures it), below the int8 rate without it; forward then
  // makes no operand for the projections.
  TrainOptions int8_lean = options(2048);
  int8_lean.master_dtype = MasterDtype::bfloat16;
  int8_lean.adamw.moments = MomentStorage::int8;
  TrainOptions int8_always = int8_lean;
  int8_always.keep_weight_operands = KeepWeightOperands::always;
  const double int8_operand_rate = update_elements_per_s(h200, MomentStorage::int8, MasterDtype::bfloat16, true);
  EXPECT_GT(int8_operand_rate, 0.0);
  EXPECT_LT(int8_operand_rate, update_elements_per_s(h200, MomentStorage::int8, MasterDtype::bfloat16));
  EXPECT_LT(update_elements_per_s(h200, MomentStorage::int8, MasterDtype::float32, true),
            update_elements_per_s(h200, MomentStorage::int8, MasterDtype::float32));
  const StepTimePlan int8_plan = predict_step_time(c, false, int8_lean, h200);
  const StepTimePlan int8_always_plan = predict_step_time(c, false, int8_always, h200);
  const PhaseTime& int8_operand = phase(int8_always_plan, "optimizer_step_done");
  ASSERT_GT(int8_operand.operand_updated, 3e9);
  const PhaseTime& u = int8_operand;
  const double others_s = std::max((u.update_bytes - u.norm_bytes - u.operand_update_bytes) / (4800e9 * 0.85),
                                   (u.updated - u.operand_updated) / 138.8e9);
  const double operand_s =
      std::max(u.operand_update_bytes / (4800e9 * 0.85), u.operand_updated / (int8_operand_rate * 1e9));
  EXPECT_NEAR(u.ms, 1e3 * (u.norm_bytes / (4800e9 * 0.85) + others_s + operand_s), 1e-9 * u.ms);
  EXPECT_LT(phase(int8_always_plan, "forward_done").bytes, phase(int8_plan, "forward_done").bytes)
      << "the update's operand leaves forward's to make";
}

// Without a flag naming it, a run is predicted (and its MFU measured) with the rates of the GPU it runs on: a
// DGX Spark's GB10 against its own peak, not an H100's.
TEST(StepTimeModel, DefaultRatesFollowTheGpu) {
  EXPECT_EQ(rates_name_for_gpu(12, 1, uint64_t{128} << 30), "gb10");
  EXPECT_EQ(rates_name_for_gpu(9, 0, uint64_t{80} << 30), "h100");
  EXPECT_EQ(rates_name_for_gpu(9, 0, uint64_t{141} << 30), "h200");
  EXPECT_EQ(rates_name_for_gpu(8, 0, uint64_t{80} << 30), "h100") << "an unknown GPU: the H100's rates";
  EXPECT_EQ(default_rates_name(c10::Device(c10::kCPU)), "cpu");
#if !defined(QWEN3_TORCH_HAS_CUDA)
  EXPECT_EQ(default_rates_name(c10::Device(c10::kCUDA, 0)), "h100") << "no device to read: the H100's rates";
#endif
}

const StepTerm* term(const PhaseTime& p, const std::string& name) {
  for (const StepTerm& t : p.terms)
    if (t.name == name) return &t;
  return nullptr;
}

// Packed rows on a GPU run each sample alone through the flash node: attention costs the sum of the samples'
// squares, not B·T² (a row of four samples of T/4: a quarter), and nothing else changes; where attention takes
// the whole masked row (a CPU) the sum does not apply.
TEST(StepTimeModel, PackedRowsAttentionCountsEachSampleAlone) {
  const Qwen3Config c = qwen3_4b();
  const TrainOptions o = options(2048, 2);
  const double whole = 2 * 2048.0 * 2048.0, quarters = 2 * 4 * 512.0 * 512.0;
  for (const char* device : {"h100", "cpu"}) {
    const StepTimePlan rows = predict_step_time(c, false, o, device_rates(device));
    const StepTimePlan packed = predict_step_time(c, false, o, device_rates(device), quarters);
    const bool per_sample = std::string(device) != "cpu";
    EXPECT_EQ(rows.attention_square, whole);
    EXPECT_EQ(rows.whole_rows_square, whole);
    EXPECT_EQ(packed.attention_square, per_sample ? quarters : whole) << device;
    for (const char* name : {"forward_done", "backward_done"}) {
      const StepTerm* a = term(phase(rows, name), "attention");
      const StepTerm* b = term(phase(packed, name), "attention");
      ASSERT_TRUE(a && b) << device << " " << name;
      EXPECT_NEAR(b->flops, a->flops * (per_sample ? 0.25 : 1.0), 1e-9 * a->flops) << device << " " << name;
      EXPECT_NEAR(phase(packed, name).flops - b->flops, phase(rows, name).flops - a->flops,
                  1e-9 * phase(rows, name).flops)
          << "only attention changes: " << device << " " << name;
    }
  }
}

// Every FLOP and byte of a phase belongs to a named term (StepTerm) (the phase's time is the terms' by construction):
// what vram-report --predict-only prints under each phase, so that each figure points at the place in
// predict_step_time that counts it. Checked for the configurations whose counts differ (plain, checkpointed with
// each operand choice, kept across steps, the optimizer in backward, a frozen part, a sparse model, the CPU).
TEST(StepTimeModel, EveryFlopAndByteBelongsToANamedTerm) {
  const Qwen3Config dense = qwen3_4b(), sparse = preset_config("qwen3-30b-a3b");
  std::vector<std::pair<std::string, TrainOptions>> cases;
  cases.emplace_back("plain", options(2048));
  TrainOptions lean = options(2048);
  lean.grad_checkpoint = lean.fused_optimizer = true;
  cases.emplace_back("lean", lean);
  for (const KeepWeightOperands keep :
       {KeepWeightOperands::off, KeepWeightOperands::recompute, KeepWeightOperands::backward}) {
    TrainOptions o = lean;
    o.keep_weight_operands = keep;
    cases.emplace_back(std::string("lean ") + to_string(keep), o);
  }
  TrainOptions always = options(512, 4);
  always.master_dtype = MasterDtype::float32;
  always.adamw.moments = MomentStorage::float32;
  always.keep_weight_operands = KeepWeightOperands::always;
  cases.emplace_back("always", always);
  TrainOptions last = lean;
  last.train_last_layers = 6;
  cases.emplace_back("last layers", last);
  TrainOptions ten = lean;
  ten.grad_checkpoint_blocks = 10;
  cases.emplace_back("lean, 10 blocks recomputed", ten);
  for (const auto& [name, o] : cases)
    for (const bool moe : {false, true})
      for (const std::string device : {"h100", "gb10", "cpu"}) {
        TrainOptions run = o;
        if (device == "cpu") run.compute_dtype = ComputeDtype::float32;
        const Qwen3Config& c = moe ? sparse : dense;
        const StepTimePlan plan = predict_step_time(c, !c.tie_word_embeddings, run, device_rates(device));
        const std::string what = name + (moe ? " moe " : " dense ") + device;
        for (const PhaseTime& p : plan.phases) {
          double flops = 0, bytes = 0;
          for (const StepTerm& t : p.terms) {
            flops += t.flops, bytes += t.bytes;
            EXPECT_TRUE(t.flops > 0 || t.bytes > 0) << what << " " << p.phase << ": " << t.name;
          }
          EXPECT_NEAR(flops, p.flops, 1e-9 * p.flops + 1) << what << " " << p.phase;
          EXPECT_NEAR(bytes, p.bytes, 1e-9 * p.bytes + 1) << what << " " << p.phase;
        }
      }
  // The terms are the counts the other tests pin: the lean step's recompute runs forward's products but each dense
  // block's trained down_proj, and its activations' passes but the residual add after it.
  const StepTimePlan plan = predict_step_time(dense, false, lean, device_rates("h100"));
  const ModelShape s = dense.shape();
  const double N = 2048, H = s.hidden, I = s.intermediate;
  const PhaseTime &forward = phase(plan, "forward_done"), &backward = phase(plan, "backward_done");
  ASSERT_TRUE(term(forward, "projections") && term(backward, "recompute: projections"));
  EXPECT_NEAR(term(forward, "projections")->flops - term(backward, "recompute: projections")->flops,
              s.layers * 2 * N * H * I, 1.0);
  EXPECT_NEAR(term(forward, "activations")->bytes - term(backward, "recompute: activations")->bytes,
              s.layers * N * 2 * 3 * H, 1.0);
  ASSERT_TRUE(term(backward, "update") && term(backward, "gradient norm read"));
  // --grad-checkpoint-blocks 12 of 36: the recompute's products a third of all blocks' (the blocks are alike).
  TrainOptions partial = lean;
  partial.grad_checkpoint_blocks = 12;
  const StepTimePlan third = predict_step_time(dense, false, partial, device_rates("h100"));
  EXPECT_NEAR(term(phase(third, "backward_done"), "recompute: projections")->flops,
              term(backward, "recompute: projections")->flops / 3, 1.0);
  partial.grad_checkpoint_blocks = 0;
  EXPECT_EQ(term(phase(predict_step_time(dense, false, partial, device_rates("h100")), "backward_done"),
                 "recompute: projections"),
            nullptr);
  EXPECT_EQ(term(backward, "update")->kind, StepTerm::Kind::update);
  EXPECT_EQ(term(forward, "update"), nullptr) << "no update in forward";
}

TEST(StepTimeModel, PredictOnlyPrintsTheTimeForANamedDevice) {
  test::TempDir dir;
  const std::string config = dir.file("config.json");
  {
    std::ofstream out(config);
    out << qwen3_4b().to_json().dump();
  }
  auto r = test::run_cli("vram-report --predict-only --config " + config + " --seq-len 2048 --predict-device gb10");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("predicted time of one step on gb10"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memory shared with the CPU"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("backward_done"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" ms; compute floor "), std::string::npos) << r.out;
  // Each phase's terms under it (StepTerm), indented.
  EXPECT_NE(r.out.find("\n  loss: logits "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  gradient norm read "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("predicted memory of one step on cuda"), std::string::npos) << r.out;
  // GB10's one number: the tensors' peak plus the runtime, against the machine's 128 GB.
  EXPECT_NE(r.out.find("one memory pool (gb10: the GPU's memory is the machine's): predicted "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(" GB of 128.0 GB = tensors at their peak "), std::string::npos) << r.out;
  r = test::run_cli("vram-report --predict-only --config " + config + " --seq-len 2048 --predict-device h100");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("one memory pool"), std::string::npos) << "an H100's memory is its own: " << r.out;
  EXPECT_EQ(r.out.find("where it writes the operand"), std::string::npos) << r.out;
  // The update's element rate, and where it writes the operand (always) that update's rate beside it.
  r = test::run_cli("vram-report --predict-only --config " + config +
                    " --seq-len 2048 --predict-device h100 --master-dtype bfloat16 --optimizer-state-mode int8 "
                    "--keep-weight-operands always");
  ASSERT_EQ(r.code, 0) << r.err;
  char expected[96];
  std::snprintf(expected, sizeof expected, "the update at most 138.8 G parameters/s (%.1f where it writes the operand)",
                update_elements_per_s(device_rates("h100"), MomentStorage::int8, MasterDtype::bfloat16, true));
  EXPECT_NE(r.out.find(expected), std::string::npos) << r.out;
  r = test::run_cli("vram-report --predict-only --config " + config + " --predict-device tpu");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--predict-device"), std::string::npos) << r.err;
}

// Model FLOPs per token: 6 per parameter but the input embedding (Qwen3-4B has 4,022,468,096 parameters, what
// transformers' num_parameters() says of the tied model: the head is the embedding, counted once) plus PaLM's
// 12·L·(heads·head_dim)·T for attention; nothing for recompute or freezing, which are not in the signature.
TEST(ModelFlops, SixPerParameterPlusAttentionAtTheRowLength) {
  const Qwen3Config c = qwen3_4b();
  EXPECT_EQ(model_flops_per_token(c, 2048), 6.0 * 4022468096.0 + 12.0 * 36 * 32 * 128 * 2048);
  EXPECT_EQ(model_flops_per_token(c, 512) - model_flops_per_token(c, 256), 12.0 * 36 * 4096 * 256);
}

}  // namespace
}  // namespace qwen3
