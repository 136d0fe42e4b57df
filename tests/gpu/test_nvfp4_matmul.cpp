// The NVFP4-weight product Y = X · deq(W)ᵀ on the device against fp64 references built from the CPU codec's
// dequantized weights. Skips cleanly without a device.
//
// Two kinds of check:
//  - exact: X holds small integers and the scales lie in [0.5, 1.875], so every product is a multiple of 2^-5
//    and every partial sum stays below 2^19: all of them are fp32-representable, the fp32 accumulation is
//    exact in any order and any split, and Y must equal RN_out(reference) bit for bit. Catches any wrong
//    pairing of X with W, lost or doubled blocks, wrong scales, bad tails.
//  - bounded: Gaussian data. The products x·w are exact in fp32 (8 x 6 significant bits) and the only error is
//    the accumulation: |Y_acc - ref| <= gamma * sum_k |x_k w_k| with gamma = K * u, u = 2^-22 (the textbook
//    (K-1)·2^-24 for round-to-nearest, with 4x headroom for tensor-core alignment truncation and the split-K
//    reduction), then the output rounding, |Y - Y_acc| <= u_out * |Y_acc| (+ half the smallest f16 subnormal).
//    Each element must meet its bound, and so must the relative Frobenius norm ||Y - ref|| / ||ref||.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gpu_test_util.h"
#include "nvfp4_test_data.h"
#include "qwen3/nvfp4/nvfp4.h"
#include "qwen3_kernels.h"

namespace qwen3 {
namespace {

using kernels::KernelDType;
using gpu_test::DeviceBuffer;

struct Problem {
  int64_t M, N, K;
  std::vector<float> x;            // [M, K], each value exactly representable in the X type
  std::vector<uint8_t> codes;      // [N, K/2]
  std::vector<uint8_t> scales;     // [N, K/16]
  std::vector<double> reference;   // [M, N] = sum_k x · deq(w), fp64
  std::vector<double> abs_sum;     // [M, N] = sum_k |x · deq(w)|
};

void compute_reference(Problem& p) {
  std::vector<float> w(p.N * p.K);
  nvfp4::dequantize_rows_cpu(p.codes.data(), p.scales.data(), p.N, p.K, w.data());
  p.reference.assign(p.M * p.N, 0.0);
  p.abs_sum.assign(p.M * p.N, 0.0);
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      double sum = 0.0, abs_sum = 0.0;
      const float* xr = &p.x[m * p.K];
      const float* wr = &w[n * p.K];
      for (int64_t k = 0; k < p.K; ++k) {
        const double term = static_cast<double>(xr[k]) * static_cast<double>(wr[k]);
        sum += term;
        abs_sum += std::fabs(term);
      }
      p.reference[m * p.N + n] = sum;
      p.abs_sum[m * p.N + n] = abs_sum;
    }
}

// Integer X in [-3, 3], random codes (all 16, -0 included), scale codes 0x30..0x3F (0.5 .. 1.875).
Problem exact_problem(int64_t M, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p{M, N, K, {}, {}, {}, {}, {}};
  p.x.resize(M * K);
  for (float& v : p.x) v = static_cast<float>(static_cast<int>(rng() % 7) - 3);
  p.codes.resize(N * K / 2);
  for (uint8_t& c : p.codes) c = static_cast<uint8_t>(rng());
  p.scales.resize(N * K / 16);
  for (uint8_t& s : p.scales) s = static_cast<uint8_t>(0x30 + rng() % 16);
  compute_reference(p);
  return p;
}

// Gaussian X rounded to x_type; W ~ N(0, 1/K) quantized by the CPU codec (search mode on odd seeds).
Problem random_problem(int64_t M, int64_t N, int64_t K, KernelDType x_type, uint32_t seed) {
  Problem p{M, N, K, {}, {}, {}, {}, {}};
  gpu_test::to_16bit(x_type, gpu_test::gaussian(M * K, 1.0f, seed), p.x);
  const std::vector<float> w = gpu_test::gaussian(N * K, 1.0f / std::sqrt(static_cast<float>(K)), seed + 1000);
  p.codes.resize(N * K / 2);
  p.scales.resize(N * K / 16);
  nvfp4::quantize_rows_cpu(w.data(), N, K, p.codes.data(), p.scales.data(),
                           seed % 2 ? nvfp4::ScaleMode::search : nvfp4::ScaleMode::rne);
  compute_reference(p);
  return p;
}

// Runs the kernel; returns Y as fp32 values (exact conversions of the output type).
std::vector<float> run_matmul(const Problem& p, KernelDType x_type, KernelDType y_type) {
  std::vector<float> result;
  std::vector<uint16_t> x_bits(p.x.size());
  for (size_t i = 0; i < p.x.size(); ++i) x_bits[i] = gpu_test::to_bits(x_type, p.x[i]);
  const size_t y_bytes = p.M * p.N * (y_type == KernelDType::f32 ? 4 : 2);
  DeviceBuffer x(x_bits.size() * 2), codes(p.codes.size()), scales(p.scales.size()), y(y_bytes);
  EXPECT_TRUE(x.ok() && codes.ok() && scales.ok() && y.ok());
  if (!(x.ok() && codes.ok() && scales.ok() && y.ok())) return result;
  gpu_test::upload(x_bits, x.at());
  gpu_test::upload(p.codes, codes.at());
  gpu_test::upload(p.scales, scales.at());
  EXPECT_EQ(cudaMemset(y.at(), 0xFF, y_bytes), cudaSuccess);  // NaN everywhere: an unwritten element shows
  const int status = kernels::launch_nvfp4_matmul(x.at(), x_type, p.M, p.K, codes.at(), scales.at(), p.N, y.at(),
                                                  y_type, nullptr);
  EXPECT_EQ(status, 0) << cudaGetErrorString(static_cast<cudaError_t>(status));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  result.resize(p.M * p.N);
  if (y_type == KernelDType::f32) {
    gpu_test::download(y.at(), result);
  } else {
    std::vector<uint16_t> bits(p.M * p.N);
    gpu_test::download(y.at(), bits);
    for (size_t i = 0; i < bits.size(); ++i) result[i] = gpu_test::from_bits(y_type, bits[i]);
  }
  return result;
}

float round_to(KernelDType type, double v) {
  const float f = static_cast<float>(v);
  return type == KernelDType::f32 ? f : gpu_test::from_bits(type, gpu_test::to_bits(type, f));
}

std::string describe(const Problem& p, KernelDType x_type, KernelDType y_type) {
  return "M=" + std::to_string(p.M) + " N=" + std::to_string(p.N) + " K=" + std::to_string(p.K) + " x " +
         gpu_test::dtype_name(x_type) + " y " + gpu_test::dtype_name(y_type);
}

TEST(GpuMatmulKernel, ExactWhenEveryPartialSumIsRepresentable) {
  QWEN3_REQUIRE_GPU();
  // M = 1, 2, 5, 16 take the 16-row tile; 17+ the 128-row tile. N and K off the 128 x 64 tile grid, K down to
  // one block; K = 2560 and 4096 with few output tiles take the split-K cluster path.
  const int64_t shapes[][3] = {{1, 8, 16},     {1, 72, 48},      {17, 72, 48},    {16, 128, 64},
                               {2, 136, 80},   {33, 200, 80},    {128, 128, 128}, {130, 136, 272},
                               {300, 264, 1040}, {5, 1024, 2560}, {64, 256, 4096}, {1, 9, 32},
                               {2048, 2176, 320}};  // the last: enough tiles for no split, 5 k tiles
  uint32_t seed = 11;
  for (const auto& shape : shapes) {
    const Problem p = exact_problem(shape[0], shape[1], shape[2], seed++);
    for (KernelDType x_type : {KernelDType::bf16, KernelDType::f16})
      for (KernelDType y_type : {KernelDType::f32, KernelDType::bf16, KernelDType::f16}) {
        const std::vector<float> y = run_matmul(p, x_type, y_type);
        ASSERT_EQ(y.size(), p.reference.size());
        for (int64_t i = 0; i < p.M * p.N; ++i) {
          const float expected = round_to(y_type, p.reference[i]);
          ASSERT_TRUE(gpu_test::same_float(y[i], expected))
              << describe(p, x_type, y_type) << ": Y[" << i / p.N << ", " << i % p.N << "] = " << y[i]
              << ", expected " << expected;
        }
      }
  }
}

// Checks the bounded-error contract of the file comment; returns the relative Frobenius error.
double expect_within_accumulation_bound(const Problem& p, const std::vector<float>& y, KernelDType x_type,
                                        KernelDType y_type) {
  const double gamma = static_cast<double>(p.K) * std::ldexp(1.0, -22);
  const double u_out = y_type == KernelDType::f32 ? std::ldexp(1.0, -24)
                       : y_type == KernelDType::bf16 ? std::ldexp(1.0, -8)
                                                     : std::ldexp(1.0, -11);
  const double absolute = y_type == KernelDType::f16 ? std::ldexp(1.0, -25) : 1e-37;
  double error_sq = 0.0, reference_sq = 0.0, bound_sq = 0.0;
  for (int64_t i = 0; i < p.M * p.N; ++i) {
    const double accumulation = gamma * p.abs_sum[i];
    const double bound = accumulation + u_out * (std::fabs(p.reference[i]) + accumulation) + absolute;
    const double error = std::fabs(static_cast<double>(y[i]) - p.reference[i]);
    EXPECT_LE(error, bound) << describe(p, x_type, y_type) << ": Y[" << i / p.N << ", " << i % p.N << "] = " << y[i]
                            << ", reference " << p.reference[i];
    if (!(error <= bound)) break;
    error_sq += error * error;
    reference_sq += p.reference[i] * p.reference[i];
    bound_sq += bound * bound;
  }
  const double relative = std::sqrt(error_sq / reference_sq);
  EXPECT_LE(relative, std::sqrt(bound_sq / reference_sq)) << describe(p, x_type, y_type);
  return relative;
}

TEST(GpuMatmulKernel, Qwen3ShapesAtDecodeSizesStayWithinTheAccumulationBound) {
  QWEN3_REQUIRE_GPU();
  std::vector<std::array<int64_t, 2>> shapes{{1024, 2560}, {4096, 2560}, {2560, 4096}, {9728, 2560}, {2560, 9728}};
  std::vector<int64_t> rows{1, 16};
  if (test::small_gpu_shapes()) shapes.resize(1), rows.resize(1);
  uint32_t seed = 100;
  for (int64_t M : rows)
    for (const auto& nk : shapes) {
      const Problem p = random_problem(M, nk[0], nk[1], KernelDType::bf16, seed++);
      for (KernelDType y_type : {KernelDType::bf16, KernelDType::f32}) {
        const double relative = expect_within_accumulation_bound(p, run_matmul(p, KernelDType::bf16, y_type),
                                                                 KernelDType::bf16, y_type);
        std::printf("%s: relative Frobenius error %.3g\n", describe(p, KernelDType::bf16, y_type).c_str(), relative);
      }
    }
}

TEST(GpuMatmulKernel, RandomEdgeShapesAllTypesStayWithinTheAccumulationBound) {
  QWEN3_REQUIRE_GPU();
  std::vector<std::array<int64_t, 3>> shapes{{1, 72, 48}, {17, 72, 48}, {33, 200, 2560}, {256, 1024, 2560}, {129, 136, 9728}};
  if (test::small_gpu_shapes()) shapes.resize(3);
  uint32_t seed = 300;
  for (const auto& shape : shapes)
    for (KernelDType x_type : {KernelDType::bf16, KernelDType::f16}) {
      const Problem p = random_problem(shape[0], shape[1], shape[2], x_type, seed++);
      for (KernelDType y_type : {KernelDType::f32, KernelDType::bf16, KernelDType::f16})
        expect_within_accumulation_bound(p, run_matmul(p, x_type, y_type), x_type, y_type);
    }
}

TEST(GpuMatmulKernel, SameResultOnRepeatedRuns) {
  QWEN3_REQUIRE_GPU();
  // The split-K reduction sums the partial tiles in a fixed order: results are deterministic.
  const Problem p = random_problem(3, 1024, 4096, KernelDType::bf16, 7);
  const std::vector<float> first = run_matmul(p, KernelDType::bf16, KernelDType::f32);
  const std::vector<float> second = run_matmul(p, KernelDType::bf16, KernelDType::f32);
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); ++i) ASSERT_TRUE(gpu_test::same_float(first[i], second[i])) << i;
}

}  // namespace
}  // namespace qwen3
