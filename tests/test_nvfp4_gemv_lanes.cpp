// The small-M NVFP4 product's work split (kernels/nvfp4_gemv.cuh: a warp per two rows of W, a lane per 32-element
// chunk of k, each 16-block summed unscaled and then scaled into the lane's sums, a butterfly of the 32 lanes) run
// on the host in the kernel's order, with the kernel's own functions: against an fp64 product of the CPU codec's
// dequantized weights, bit for bit where every sum is representable and within the product's error bound
// otherwise. The kernel adds loads, shuffles and stores to these functions; tests/gpu/test_nvfp4_matmul.cpp
// checks the kernel itself (launch_nvfp4_matmul sends M <= 4 to it) wherever a GPU is.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nvfp4_gemv_host_run.h"
#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3 {
namespace {

namespace gemv = kernels::gemv;
using gemv_test::gemv_on_host;
using gemv_test::Product;

// fp64 sums of x · deq(W) and of |x · deq(W)| (the bound's scale), from the CPU codec's dequantization.
void reference(const Product& p, std::vector<double>& exact, std::vector<double>& magnitude) {
  std::vector<float> w(p.N * p.K);
  nvfp4::dequantize_rows_cpu(p.codes.data(), p.scales.data(), p.N, p.K, w.data());
  exact.assign(p.M * p.N, 0.0);
  magnitude.assign(p.M * p.N, 0.0);
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t k = 0; k < p.K; ++k) {
        const double t = static_cast<double>(p.x[m * p.K + k]) * w[n * p.K + k];
        exact[m * p.N + n] += t;
        magnitude[m * p.N + n] += std::fabs(t);
      }
}

// Every partial sum representable (integer x in [-3, 3], scales 0.5 .. 1.875, codes random): the split must give
// the exact product, which no lost chunk, wrong nibble, wrong scale or misrouted row can.
TEST(Nvfp4GemvLanes, RepresentableSumsAreExact) {
  std::mt19937 rng(17);
  for (const auto& [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 9, 32}, {2, 4, 64}, {3, 7, 2560},
                                {4, 6, 1056}, {1, 3, 9728}}) {
    Product p{M, N, K, {}, {}, {}};
    for (int64_t i = 0; i < M * K; ++i) p.x.push_back(static_cast<float>(static_cast<int>(rng() % 7) - 3));
    for (int64_t i = 0; i < N * K / 2; ++i) p.codes.push_back(static_cast<uint8_t>(rng()));
    for (int64_t i = 0; i < N * K / 16; ++i) p.scales.push_back(static_cast<uint8_t>(0x30 + rng() % 16));
    std::vector<double> exact, magnitude;
    reference(p, exact, magnitude);
    const std::vector<float> y = gemv_on_host(p);
    for (int64_t i = 0; i < M * N; ++i)
      ASSERT_EQ(static_cast<double>(y[i]), exact[i]) << "M " << M << " N " << N << " K " << K << " element " << i;
  }
}

// Quantized Gaussian weights and bf16 activations at Qwen3-4B widths: within |y - ref| <= K 2^-22 Σ|x w|, the
// bound kernels/nvfp4_kernels.md states for the tensor-core product (each x · e2m1 is exact; each block's sum,
// its scaling and the lanes' sums round).
TEST(Nvfp4GemvLanes, QuantizedWeightsAreWithinTheProductBound) {
  uint32_t seed = 5;
  for (const auto& [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 5, 2560}, {4, 3, 9728}, {2, 8, 4096}}) {
    const Product p = gemv_test::random_product(M, N, K, seed++);
    std::vector<double> exact, magnitude;
    reference(p, exact, magnitude);
    const std::vector<float> y = gemv_on_host(p);
    const double gamma = static_cast<double>(K) * std::ldexp(1.0, -22);
    for (int64_t i = 0; i < M * N; ++i)
      ASSERT_LE(std::fabs(y[i] - exact[i]), gamma * magnitude[i]) << "M " << M << " K " << K << " element " << i;
  }
}

TEST(Nvfp4GemvLanes, TakesAFewRowsWhoseCodeRowsAlign) {
  EXPECT_TRUE(gemv::takes(1, 2560));
  EXPECT_TRUE(gemv::takes(4, 32));
  EXPECT_FALSE(gemv::takes(5, 2560));  // the tensor-core kernel's
  EXPECT_FALSE(gemv::takes(0, 2560));
  EXPECT_FALSE(gemv::takes(1, 48));    // a row of 24 code bytes: the next row's codes are not 16-byte aligned
}

}  // namespace
}  // namespace qwen3
