// The small-M NVFP4 product's arithmetic (nvfp4_gemv.cu): y[m, n] = Σ_k x[m, k] · deq(W)[n, k] for a few rows
// of x, as __host__ __device__ functions, so tests/test_nvfp4_gemv_lanes.cpp runs a warp's lanes on the CPU in
// the kernel's order and every CI run checks the kernel's split of the work; the kernel adds only loads, the
// shuffles of the final sum and the stores.
//
// Work of a warp: kOutputsPerWarp consecutive rows n of W (outputs), every row m of x. Lane l takes the 32-element
// chunks c = l, l + 32, ... of k: 16 code bytes of each of its W rows (one 16-byte load; a warp reads 512
// contiguous bytes a row) and their two E4M3 scales. A chunk is two 16-blocks; each block is summed without its
// scale (every x · e2m1 product is exact in fp32: at most 8 + 2 significant bits), then scaled into the lane's
// accumulator by one fused multiply-add. The lanes' accumulators meet in a butterfly of shuffles (lane l adds lane
// l ^ d for d = 16, 8, 4, 2, 1; both lanes of a pair get the same sum, fp32 addition being commutative).
// Deterministic; one rounding more a block than summing deq(W) directly, well inside the product's error bound
// (kernels/nvfp4_kernels.md).
#pragma once
#include <cstdint>

#include "nvfp4_codec.cuh"

// Every loop here has a constant trip count; unrolled on the device so the arrays stay in registers.
#if defined(__CUDA_ARCH__)
#define QWEN3_GEMV_UNROLL _Pragma("unroll")
#else
#define QWEN3_GEMV_UNROLL
#endif

namespace qwen3::kernels::gemv {

constexpr int kMaxRows = 4;          // rows of x (M) the GEMV takes; more go to the tensor-core kernel
constexpr int kOutputsPerWarp = 2;   // W rows a warp computes: each 16-byte x load feeds both rows' products
constexpr int kChunk = 32;           // elements of k a lane takes at a time (16 code bytes, two 16-blocks)
constexpr int kPiece = 8;            // elements of x in one 16-byte load of bf16/f16 (one code word)
constexpr int kLanes = 32;

// Whether the GEMV takes a product: 1 <= M <= kMaxRows and K a multiple of 32 (so every W row's codes start on
// a 16-byte boundary when the first does).
QWEN3_HD bool takes(int64_t M, int64_t K) { return M >= 1 && M <= kMaxRows && K > 0 && K % kChunk == 0; }

// One piece (8 elements of k, one code word per output) into the block sums: for each output r and row m,
// block_sum[m][r] = fmaf(x[m][i], e2m1(nibble i of word r), block_sum[m][r]) for i = 0..7 in order.
template <int kM>
QWEN3_HD void accumulate_piece(const float (&x)[kM][kPiece], const uint32_t (&word)[kOutputsPerWarp],
                               float (&block_sum)[kM][kOutputsPerWarp]) {
QWEN3_GEMV_UNROLL
  for (int i = 0; i < kPiece; ++i) {
QWEN3_GEMV_UNROLL
    for (int r = 0; r < kOutputsPerWarp; ++r) {
      const float w = codec::e2m1_to_float((word[r] >> (4 * i)) & 0xFu);
QWEN3_GEMV_UNROLL
      for (int m = 0; m < kM; ++m) block_sum[m][r] = fmaf(x[m][i], w, block_sum[m][r]);
    }
  }
}

// A finished 16-block into the lane's accumulators: acc[m][r] = fmaf(block_sum[m][r], scale of output r, acc).
template <int kM>
QWEN3_HD void finish_block(const float (&block_sum)[kM][kOutputsPerWarp], const uint8_t (&scale_code)[kOutputsPerWarp],
                           float (&acc)[kM][kOutputsPerWarp]) {
QWEN3_GEMV_UNROLL
  for (int r = 0; r < kOutputsPerWarp; ++r) {
    const float scale = codec::e4m3_to_float(scale_code[r]);
QWEN3_GEMV_UNROLL
    for (int m = 0; m < kM; ++m) acc[m][r] = fmaf(block_sum[m][r], scale, acc[m][r]);
  }
}

// Where things are, for W row n, chunk c and piece p (0..3) of the chunk: the code word's byte offset in the
// codes, the scale byte of the chunk's block b (0, 1), and the piece's first element of k.
QWEN3_HD int64_t code_word_offset(int64_t n, int64_t K, int64_t c, int p) { return n * (K / 2) + c * (kChunk / 2) + 4 * p; }
QWEN3_HD int64_t scale_offset(int64_t n, int64_t K, int64_t c, int b) { return n * (K / 16) + 2 * c + b; }
QWEN3_HD int64_t piece_first_k(int64_t c, int p) { return c * kChunk + kPiece * p; }

}  // namespace qwen3::kernels::gemv
