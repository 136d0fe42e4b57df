// Throughput of the canonical CPU NVFP4 codec against a plain memcpy of the same fp32 bytes, at a Qwen3-4B
// projection shape (4096 x 2560). Results: docs/nvfp4.md.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "qwen3/nvfp4/nvfp4.h"

namespace {

using qwen3::nvfp4::ScaleMode;

constexpr int64_t kRows = 4096;
constexpr int64_t kCols = 2560;
constexpr int64_t kFp32Bytes = kRows * kCols * 4;

const std::vector<float>& weights() {
  static const std::vector<float> values = [] {
    std::mt19937 generator(1);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> v(kRows * kCols);
    for (float& x : v) x = normal(generator);
    return v;
  }();
  return values;
}

void BM_MemcpyFp32(benchmark::State& state) {
  const std::vector<float>& source = weights();
  std::vector<float> target(source.size(), 1.0f);
  for (auto _ : state) {
    std::memcpy(target.data(), source.data(), kFp32Bytes);
    benchmark::DoNotOptimize(target.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kFp32Bytes);
}

void quantize_benchmark(benchmark::State& state, ScaleMode mode) {
  at::set_num_threads(static_cast<int>(state.range(0)));
  const std::vector<float>& x = weights();
  std::vector<uint8_t> codes(kRows * kCols / 2, 1), scales(kRows * kCols / 16, 1);
  for (auto _ : state) {
    qwen3::nvfp4::quantize_rows_cpu(x.data(), kRows, kCols, codes.data(), scales.data(), mode);
    benchmark::DoNotOptimize(codes.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kFp32Bytes);  // fp32 input bytes, as the memcpy's
}

void BM_QuantizeRne(benchmark::State& state) { quantize_benchmark(state, ScaleMode::rne); }
void BM_QuantizeSearch(benchmark::State& state) { quantize_benchmark(state, ScaleMode::search); }

void BM_DequantizeToFp32(benchmark::State& state) {
  at::set_num_threads(static_cast<int>(state.range(0)));
  std::vector<uint8_t> codes(kRows * kCols / 2), scales(kRows * kCols / 16);
  qwen3::nvfp4::quantize_rows_cpu(weights().data(), kRows, kCols, codes.data(), scales.data(), ScaleMode::rne);
  std::vector<float> out(kRows * kCols, 1.0f);
  for (auto _ : state) {
    qwen3::nvfp4::dequantize_rows_cpu(codes.data(), scales.data(), kRows, kCols, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kFp32Bytes);  // fp32 output bytes
}

// The codec's row loops have AVX-512 / AVX2 / baseline clones picked at load time: say which one ran.
const char* widest_isa() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2")) return "avx2";
  return "baseline x86-64";
#else
  return "baseline";
#endif
}

}  // namespace

BENCHMARK(BM_MemcpyFp32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_QuantizeRne)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_QuantizeSearch)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DequantizeToFp32)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("codec_isa", widest_isa());
  benchmark::AddCustomContext("shape", "4096x2560 fp32, N(0, 0.02)");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
