// The small-M NVFP4 product (kernels/nvfp4_gemv.cuh) run on the host in the kernel's order, with the kernel's own
// functions: what tests/test_nvfp4_gemv_lanes.cpp checks against fp64 and tests/gpu/test_nvfp4_gemv.cpp checks the
// kernel against, bit for bit.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "adamw_update.cuh"
#include "nvfp4_gemv.cuh"
#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3::gemv_test {

namespace gemv = kernels::gemv;

struct Product {
  int64_t M, N, K;
  std::vector<float> x;              // [M, K], values a bf16 holds exactly
  std::vector<uint8_t> codes, scales;  // W [N, K] as codes [N, K/2] and scales [N, K/16]
};

// A trained model's kind of product: Gaussian weights of 0.02 quantized by the CPU codec (rne), activations of 1
// rounded to bf16 (the kernels' own rounding, adamw::bf16_nearest).
inline Product random_product(int64_t M, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Product p{M, N, K, {}, std::vector<uint8_t>(N * K / 2), std::vector<uint8_t>(N * K / 16)};
  std::vector<float> w(N * K);
  for (float& v : w) v = 0.02f * normal(rng);
  nvfp4::quantize_rows_cpu(w.data(), N, K, p.codes.data(), p.scales.data(), nvfp4::ScaleMode::rne);
  for (int64_t i = 0; i < M * K; ++i)
    p.x.push_back(kernels::adamw::bf16_to_float(kernels::adamw::bf16_nearest(normal(rng))));
  return p;
}

// What nvfp4_gemv_kernel computes for y[m, n], every warp and lane run one after another. Lanes' sums meet as the
// shuffles make them meet: at each distance d, lane l's new sum is its own plus lane l ^ d's.
inline std::vector<float> gemv_on_host(const Product& p) {
  constexpr int kOut = gemv::kOutputsPerWarp;
  std::vector<float> y(p.M * p.N, NAN);
  const int64_t chunks = p.K / gemv::kChunk;
  for (int64_t n0 = 0; n0 < p.N; n0 += kOut) {
    std::vector<float> lane_sums(gemv::kLanes * 4 * kOut);  // [lane][m][r]
    for (int lane = 0; lane < gemv::kLanes; ++lane) {
      float acc[4][kOut] = {};
      for (int64_t c = lane; c < chunks; c += gemv::kLanes) {
        uint32_t words[kOut][4] = {};
        uint8_t scale_codes[kOut][2] = {};
        for (int r = 0; r < kOut; ++r) {
          if (n0 + r >= p.N) continue;  // a row past N: zeros, never stored
          for (int q = 0; q < 4; ++q) std::memcpy(&words[r][q], p.codes.data() + gemv::code_word_offset(n0 + r, p.K, c, q), 4);
          for (int b = 0; b < 2; ++b) scale_codes[r][b] = p.scales[gemv::scale_offset(n0 + r, p.K, c, b)];
        }
        for (int b = 0; b < 2; ++b) {
          float block_sum[4][kOut] = {};
          for (int j = 0; j < 2; ++j) {
            const int q = 2 * b + j;
            float xs[4][gemv::kPiece] = {};
            for (int64_t m = 0; m < p.M; ++m)
              for (int i = 0; i < gemv::kPiece; ++i) xs[m][i] = p.x[m * p.K + gemv::piece_first_k(c, q) + i];
            const uint32_t word[kOut] = {words[0][q], words[1][q]};
            gemv::accumulate_piece<4>(xs, word, block_sum);  // rows past M are zeros, as if absent
          }
          const uint8_t block_scales[kOut] = {scale_codes[0][b], scale_codes[1][b]};
          gemv::finish_block<4>(block_sum, block_scales, acc);
        }
      }
      for (int m = 0; m < 4; ++m)
        for (int r = 0; r < kOut; ++r) lane_sums[(lane * 4 + m) * kOut + r] = acc[m][r];
    }
    for (int d = gemv::kLanes / 2; d >= 1; d /= 2) {
      std::vector<float> next(lane_sums.size());
      for (int lane = 0; lane < gemv::kLanes; ++lane)
        for (int i = 0; i < 4 * kOut; ++i) next[lane * 4 * kOut + i] = lane_sums[lane * 4 * kOut + i] + lane_sums[(lane ^ d) * 4 * kOut + i];
      lane_sums = next;
    }
    for (int lane = 1; lane < gemv::kLanes; ++lane)  // every lane holds the same sums; lane 0 stores them
      for (int i = 0; i < 4 * kOut; ++i)
        EXPECT_EQ(lane_sums[lane * 4 * kOut + i], lane_sums[i]) << "lane " << lane;
    for (int r = 0; r < kOut && n0 + r < p.N; ++r)
      for (int64_t m = 0; m < p.M; ++m) y[m * p.N + n0 + r] = lane_sums[m * kOut + r];
  }
  return y;
}

}  // namespace qwen3::gemv_test
