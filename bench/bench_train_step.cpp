// One training step on CPU against forward+backward alone, so the optimizer's share of a step is visible, and
// forward+backward with bf16 against fp32 compute over the same fp32 masters (the CPU default of
// --compute-dtype is the faster). Model: the `synth --preset tiny` shape (3 blocks, hidden 96, Qwen3's
// 151936-token vocabulary), batch 4 x 64 tokens, NVFP4 STE projections, fp32 masters. Results:
// docs/performance.md.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/utils.h>

#include "bench_main.h"
#include "qwen3/config/config.h"
#include "qwen3/data/data.h"
#include "qwen3/model/model.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "qwen3/optim/optim.h"
#include "trainer/train_setup.h"

namespace {

using namespace qwen3;

constexpr int64_t kBatch = 4, kSeq = 64;

struct Setup {
  std::shared_ptr<Qwen3Model> model;
  train_detail::TrainableSet set;
  Batch batch;
};

// A shape whose blocks, not its vocabulary, carry the work (hidden 512, 4 blocks, a 4096-token vocabulary).
Qwen3Config block_heavy_config() {
  Qwen3Config cfg = preset_config("tiny");
  cfg.hidden_size = 512, cfg.num_hidden_layers = 4, cfg.num_attention_heads = 8, cfg.num_key_value_heads = 4;
  cfg.head_dim = 64, cfg.intermediate_size = 1536, cfg.vocab_size = 4096;
  cfg.bos_token_id = 1;
  cfg.eos_token_ids = {2};
  return cfg;
}

Setup make_setup(int64_t seq_len, const Qwen3Config& cfg = preset_config("tiny")) {
  Setup s;
  s.model = std::make_shared<Qwen3Model>(cfg, at::kFloat, at::kCPU, /*separate_lm_head=*/false);
  {
    torch::NoGradGuard g;
    at::manual_seed(0);
    for (auto& [key, t] : s.model->named_weights()) {
      if (t.dim() == 1) t.fill_(1.0);
      else t.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(t.size(1))));
    }
  }
  train_detail::use_nvfp4_projections(*s.model, nvfp4::ScaleMode::rne, /*frozen_as_codes=*/false);
  TrainOptions o;
  s.set = train_detail::select_trainable(*s.model, o);
  const at::Tensor ids = at::randint(0, cfg.vocab_size, {kBatch, seq_len + 1}, at::kLong);
  s.batch.input_ids = ids.narrow(1, 0, seq_len).contiguous();
  s.batch.target_ids = ids.narrow(1, 1, seq_len).contiguous();
  s.batch.tokens = s.batch.loss_tokens = kBatch * seq_len;
  return s;
}

// Arg: compute dtype (0 float32, 1 bfloat16).
void BM_ForwardBackward(benchmark::State& state) {
  Setup s = make_setup(kSeq);
  s.model->set_compute_dtype(state.range(0) == 0 ? at::kFloat : at::kBFloat16);
  state.SetLabel(state.range(0) == 0 ? "fp32 compute" : "bf16 compute");
  for (auto _ : state) {
    train_detail::compute_loss(*s.model, s.batch, LossKind::cross_entropy).backward();
    for (auto& p : s.set.params) p.param.mutable_grad() = at::Tensor();
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(kBatch * kSeq), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ForwardBackward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same on the block-heavy shape, batch 4 x 256.
void BM_ForwardBackwardBlocks(benchmark::State& state) {
  Setup s = make_setup(256, block_heavy_config());
  s.model->set_compute_dtype(state.range(0) == 0 ? at::kFloat : at::kBFloat16);
  state.SetLabel(state.range(0) == 0 ? "fp32 compute" : "bf16 compute");
  for (auto _ : state) {
    train_detail::compute_loss(*s.model, s.batch, LossKind::cross_entropy).backward();
    for (auto& p : s.set.params) p.param.mutable_grad() = at::Tensor();
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(kBatch * 256), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ForwardBackwardBlocks)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// Arg: moment storage (0 float32, 1 bfloat16, 2 int8, 3 nvfp4).
void BM_TrainStep(benchmark::State& state) {
  Setup s = make_setup(kSeq);
  AdamWOptions ao;
  ao.moments = static_cast<MomentStorage>(state.range(0));
  AdamW opt(s.set.params, ao);
  for (auto _ : state) {
    const at::Tensor loss = train_detail::compute_loss(*s.model, s.batch, LossKind::cross_entropy);
    loss.backward();
    benchmark::DoNotOptimize(loss.item<double>());
    opt.step(1e-4, clip_factor(std::sqrt(grad_square_sum(s.set.params).item<double>()), 1.0));
    for (auto& p : s.set.params) p.param.mutable_grad() = at::Tensor();
  }
  state.SetLabel(moment_storage_name(ao.moments));
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(kBatch * kSeq), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TrainStep)->Arg(0)->Arg(2)->Arg(3)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

// The product rate the step-time model's `cpu` device assumes (src/trainer/step_time_model.cpp): one of a
// Qwen3-4B step's largest products at a CPU run's token count, x [32, 2560] times a gate projection's
// W [9728, 2560] transposed, as the straight-through linear computes it. Arg: dtype (0 float32, 1 bfloat16).
void BM_ProductRate(benchmark::State& state) {
  const at::ScalarType dtype = state.range(0) ? at::kBFloat16 : at::kFloat;
  constexpr int64_t kM = 32, kK = 2560, kN = 9728;
  at::manual_seed(0);
  const at::Tensor x = at::randn({kM, kK}).to(dtype), w = at::randn({kN, kK}).to(dtype);
  for (auto _ : state) benchmark::DoNotOptimize(at::matmul(x, w.t()));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kM * kK * kN * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ProductRate)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

QWEN3_BENCHMARK_MAIN()
