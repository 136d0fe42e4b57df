// AdamW step time on CPU for each moment storage and master dtype, on one Qwen3-4B-shaped 4096 x 2560 tensor
// (10.5 M parameters), whole-tensor and in 256-row chunks. Counters: ms per million parameters, state bytes
// per parameter. Results: docs/optim.md.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <vector>

#include "bench_main.h"
#include "qwen3/optim/optim.h"

namespace {

using qwen3::AdamW;
using qwen3::AdamWOptions;
using qwen3::MomentStorage;
using qwen3::OptimParam;

constexpr int64_t kRows = 4096;
constexpr int64_t kCols = 2560;

void BM_AdamWStep(benchmark::State& state) {
  const auto storage = static_cast<MomentStorage>(state.range(0));
  const at::ScalarType master = state.range(1) == 0 ? at::kFloat : at::kBFloat16;
  const int64_t chunk_rows = state.range(2);
  at::manual_seed(1);
  at::Tensor weight = (at::randn({kRows, kCols}) * 0.02).to(master);
  weight.requires_grad_(true);
  weight.mutable_grad() = (at::randn({kRows, kCols}) * 1e-4).to(master);
  AdamWOptions options;
  options.moments = storage;
  options.weight_decay = 0.01;
  options.step_chunk_rows = chunk_rows;
  AdamW optimizer({OptimParam{"w", weight, true}}, options);
  optimizer.step(1e-5);  // the first step writes every state page once
  for (auto _ : state) optimizer.step(1e-5);
  const double params = static_cast<double>(kRows * kCols);
  // A rate inverted: elapsed seconds / (steps * params * 1e-9) = milliseconds per step per million parameters.
  state.counters["ms_per_Mparam"] = benchmark::Counter(static_cast<double>(state.iterations()) * params * 1e-9,
                                                       benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["state_B_per_param"] = static_cast<double>(optimizer.state_bytes()) / params;
  state.SetLabel(std::string(qwen3::moment_storage_name(storage)) + " moments, " +
                 (master == at::kFloat ? "fp32" : "bf16") + " master" +
                 (chunk_rows ? ", chunks of " + std::to_string(chunk_rows) + " rows" : ", whole tensor"));
}

void storages(benchmark::internal::Benchmark* b) {
  for (int chunk : {0, 256})
    for (int master : {0, 1})
      for (MomentStorage s : {MomentStorage::float32, MomentStorage::bfloat16, MomentStorage::int8,
                              MomentStorage::nvfp4})
        b->Args({static_cast<int64_t>(s), master, chunk});
}

BENCHMARK(BM_AdamWStep)->Apply(storages)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

}  // namespace

QWEN3_BENCHMARK_MAIN()
