// One training step on CPU against forward+backward alone, so the optimizer's share of a step is visible.
// Model: the `synth --preset tiny` shape (3 blocks, hidden 96, Qwen3's 151936-token vocabulary), batch 4 x 64
// tokens, NVFP4 STE projections, fp32 masters. Results: docs/performance.md.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "qwen3/config.h"
#include "qwen3/data.h"
#include "qwen3/model.h"
#include "qwen3/nvfp4_linear.h"
#include "qwen3/optim.h"
#include "trainer/train_setup.h"

namespace {

using namespace qwen3;

constexpr int64_t kBatch = 4, kSeq = 64;

struct Setup {
  std::shared_ptr<Qwen3Model> model;
  train_detail::TrainableSet set;
  Batch batch;
};

Setup make_setup(int64_t seq_len) {
  Setup s;
  const Qwen3Config cfg = preset_config("tiny");
  s.model = std::make_shared<Qwen3Model>(cfg, at::kFloat, at::kCPU, /*separate_lm_head=*/false);
  {
    torch::NoGradGuard g;
    at::manual_seed(0);
    for (auto& [key, t] : s.model->named_weights()) {
      if (t.dim() == 1) t.fill_(1.0);
      else t.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(t.size(1))));
    }
  }
  s.model->set_projection_op([](const at::Tensor& x, const at::Tensor& w) { return nvfp4::ste_linear(x, w); });
  TrainOptions o;
  s.set = train_detail::select_trainable(*s.model, o);
  const at::Tensor ids = at::randint(0, cfg.vocab_size, {kBatch, seq_len + 1}, at::kLong);
  s.batch.input_ids = ids.narrow(1, 0, seq_len).contiguous();
  s.batch.target_ids = ids.narrow(1, 1, seq_len).contiguous();
  s.batch.tokens = s.batch.loss_tokens = kBatch * seq_len;
  return s;
}

void BM_ForwardBackward(benchmark::State& state) {
  Setup s = make_setup(kSeq);
  for (auto _ : state) {
    train_detail::compute_loss(*s.model, s.batch, "ce").backward();
    for (auto& p : s.set.params) p.param.mutable_grad() = at::Tensor();
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(kBatch * kSeq), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

// Arg: moment storage (0 float32, 1 bfloat16, 2 int8, 3 nvfp4).
void BM_TrainStep(benchmark::State& state) {
  Setup s = make_setup(kSeq);
  AdamWOptions ao;
  ao.moments = static_cast<MomentStorage>(state.range(0));
  AdamW opt(s.set.params, ao);
  for (auto _ : state) {
    const at::Tensor loss = train_detail::compute_loss(*s.model, s.batch, "ce");
    loss.backward();
    benchmark::DoNotOptimize(loss.item<double>());
    clip_grad_norm(s.set.params, 1.0);
    opt.step(1e-4);
    for (auto& p : s.set.params) p.param.mutable_grad() = at::Tensor();
  }
  state.SetLabel(moment_storage_name(ao.moments));
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(kBatch * kSeq), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TrainStep)->Arg(0)->Arg(2)->Arg(3)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
