// RMSNorm forward and dx over wide rows (a token's hidden state: 1,024 to 5,120 columns of whole 8-element pieces):
// a CTA of kWideThreads threads a row, each thread holding its pieces of the row in registers between the two
// passes. fused_ops.cu's launchers take these where takes_wide_rows says so; the weight gradient stays
// rmsnorm_dw_partial_kernel's. Why (kernels/fused_ops.md, "Wide rows"): a warp a row gave a 2,048-token step 2,048
// warps, 16 an SM of the 64 it holds, each walking its 5 KB row twice in round trips of four 16-byte loads a lane
// with a reduction between; the third GPU round measured the forward at 43% and the backward at 34% of a copy.
// Here a row is 128 threads with all their loads in flight at once, and the second pass reads registers.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "fused_ops.cuh"
#include "fused_rows.cuh"
#include "vector_access.cuh"

namespace qwen3::kernels::rows {

constexpr int kWideThreads = 128;  // four warps a row
constexpr int kWidePieces = 5;     // a thread's pieces at most: rows of up to 128 x 5 x 8 = 5,120 columns
constexpr int64_t kWideMinCols = 1024;

// Whether rows of `cols` columns (on the vector path) go to the kernels below.
inline bool takes_wide_rows(int64_t cols, int vectorized) {
  return vectorized && cols >= kWideMinCols && cols <= int64_t{kWideThreads} * kWidePieces * kVec;
}

// A CTA a row, grid-stride: at most 65,535 CTAs.
inline int wide_rows_grid(int64_t rows) { return grid_for(rows, 1); }

// The CTA's total of one value a thread, in a fixed order: each warp's butterfly (every lane ends with the same
// bits: a + b is b + a), then the warps' totals in warp order. Every thread gets the total. `scratch` holds a float a
// warp; the second barrier lets the next row reuse it.
__device__ __forceinline__ float cta_row_sum(float x, float* scratch) {
  x = row_sum(x, 32);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWideThreads / 32; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

// Piece p of this thread's share of a row of `pieces` pieces: thread t holds pieces t, t + 128, ... (a warp's loads
// are 512 contiguous bytes of a bf16 row).
__device__ __forceinline__ int64_t wide_piece(int p) { return threadIdx.x + static_cast<int64_t>(p) * kWideThreads; }

// y = T(T(w) T(x rstd)) and rstd, as rmsnorm_forward_kernel computes them (fused_ops.cuh's element rule); the sum
// of squares in this kernel's order (each thread's pieces in order, then cta_row_sum).
template <bool kBf16, bool kBf16Weight>
__global__ void __launch_bounds__(kWideThreads)
    rmsnorm_forward_wide_kernel(const void* x, const void* w, int64_t rows, int64_t cols, float eps, void* y,
                                float* rstd) {
  __shared__ float scratch[kWideThreads / 32];
  const int64_t pieces = cols / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * cols;
    vec::PieceOf<kBf16, kVec> held[kWidePieces];
#pragma unroll
    for (int p = 0; p < kWidePieces; ++p)
      if (wide_piece(p) < pieces) held[p] = vec::load_piece<kBf16, kVec>(x, base + wide_piece(p) * kVec);
    float squares = 0.0f;
#pragma unroll
    for (int p = 0; p < kWidePieces; ++p) {
      if (wide_piece(p) >= pieces) continue;
      float v[kVec];
      vec::unpack<kBf16, kVec>(held[p], v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) squares = fmaf(v[k], v[k], squares);
    }
    const float r = fused::rmsnorm_rstd(cta_row_sum(squares, scratch), cols, eps);
#pragma unroll
    for (int p = 0; p < kWidePieces; ++p) {
      if (wide_piece(p) >= pieces) continue;
      const int64_t c = wide_piece(p) * kVec;
      float v[kVec], wv[kVec];
      vec::unpack<kBf16, kVec>(held[p], v);
      vec::load<kBf16Weight, kVec>(w, c, wv);
#pragma unroll
      for (int k = 0; k < kVec; ++k) v[k] = fused::rmsnorm_output<kBf16>(v[k], r, wv[k]);
      vec::store<kBf16, kVec>(y, base + c, v);
    }
    if (threadIdx.x == 0) rstd[row] = r;
  }
}

// dx = rstd (g - n mean(g n)) with n = x rstd and g = dy T(w), plus dx_add (nullable) as rmsnorm_dx_kernel adds it:
// dx rounded to the activation dtype, then the sum rounded. mean(g n) in this kernel's order.
template <bool kBf16, bool kBf16Weight>
__global__ void __launch_bounds__(kWideThreads)
    rmsnorm_dx_wide_kernel(const void* dy, const void* x, const void* w, const float* rstd, int64_t rows,
                           int64_t cols, void* dx, const void* dx_add) {
  __shared__ float scratch[kWideThreads / 32];
  const int64_t pieces = cols / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * cols;
    const float r = rstd[row];
    // dx_add's pieces too, before the reduction: every load of the row in flight at once.
    vec::PieceOf<kBf16, kVec> held_x[kWidePieces], held_dy[kWidePieces], held_add[kWidePieces];
#pragma unroll
    for (int p = 0; p < kWidePieces; ++p)
      if (wide_piece(p) < pieces) {
        held_x[p] = vec::load_piece<kBf16, kVec>(x, base + wide_piece(p) * kVec);
        held_dy[p] = vec::load_piece<kBf16, kVec>(dy, base + wide_piece(p) * kVec);
        if (dx_add) held_add[p] = vec::load_piece<kBf16, kVec>(dx_add, base + wide_piece(p) * kVec);
      }
    float dot = 0.0f;
#pragma unroll
    for (int p = 0; p < kWidePieces; ++p) {
      if (wide_piece(p) >= pieces) continue;
      float xv[kVec], dyv[kVec], wv[kVec];
      vec::unpack<kBf16, kVec>(held_x[p], xv);
      vec::unpack<kBf16, kVec>(held_dy[p], dyv);
      vec::load<kBf16Weight, kVec>(w, wide_piece(p) * kVec, wv);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        dot = fmaf(fused::rmsnorm_grad_n<kBf16>(dyv[k], wv[k]), fused::mul_rn(xv[k], r), dot);
    }
    const float mean = cta_row_sum(dot, scratch) / static_cast<float>(cols);
#pragma unroll
    for (int p = 0; p < kWidePieces; ++p) {
      if (wide_piece(p) >= pieces) continue;
      const int64_t c = wide_piece(p) * kVec;
      float xv[kVec], dyv[kVec], wv[kVec];
      vec::unpack<kBf16, kVec>(held_x[p], xv);
      vec::unpack<kBf16, kVec>(held_dy[p], dyv);
      vec::load<kBf16Weight, kVec>(w, c, wv);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        xv[k] = fused::rmsnorm_dx(fused::rmsnorm_grad_n<kBf16>(dyv[k], wv[k]), fused::mul_rn(xv[k], r), mean, r);
      if (dx_add) {
        float addv[kVec];
        vec::unpack<kBf16, kVec>(held_add[p], addv);
#pragma unroll
        for (int k = 0; k < kVec; ++k) xv[k] = fused::add_rn(fused::round_to<kBf16>(xv[k]), addv[k]);
      }
      vec::store<kBf16, kVec>(dx, base + c, xv);
    }
  }
}

}  // namespace qwen3::kernels::rows
