// What the row kernels of fused_ops.cu and head_norm_rope.cu share: their CTA shape, the warp's walk over rows
// (a warp a row, or several narrow rows a warp), the butterfly that meets a row's sums, the argument checks, and
// the second stage of an RMSNorm weight gradient (the chunks' partial sums, summed in the fixed order of
// fused_ops.cuh). Layout of work and why: kernels/fused_ops.md.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "qwen3_kernels.h"
#include "vector_access.cuh"

namespace qwen3::kernels::rows {

constexpr int kThreads = 256;
constexpr int kWarpsPerCta = kThreads / 32;
// Elements a thread reads at once on the vector paths: 16 bytes of bf16 (two 16-byte loads of fp32).
constexpr int kVec = 8;

inline int grid_for(int64_t items, int64_t per_cta) {
  const int64_t ctas = (items + per_cta - 1) / per_cta;
  return static_cast<int>(ctas < 1 ? 1 : (ctas > 65535 ? 65535 : ctas));
}

// The vector path (`vectorized`: rows of whole 8-element pieces, every pointer aligned for them): a lane reads 8
// consecutive elements at a time, so a warp reads 512 contiguous bytes of a bf16 row instead of 64. A row of at
// most 16 pieces (the q/k norms: 128 columns, 16 pieces) takes `row_lanes` lanes, the power of two that covers its
// pieces, and a warp takes 32 / row_lanes rows: a warp a 128-wide row left half its lanes idle. The sums meet by
// a butterfly over the row's lanes, which gives the bits of the whole warp's butterfly the kernels used before
// (the lanes beyond a row's pieces held zeros, which the first steps added exactly).
__device__ __forceinline__ float row_sum(float x, int row_lanes) {
  for (int offset = row_lanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xFFFFFFFFu, x, offset);
  return x;
}

// Calls body(row, in, row_lane) for this lane's rows: a warp takes 32 / row_lanes rows at a time, row_lanes lanes
// each, and walks them grid-stride. Every lane of a warp makes the same calls (the shuffles need all 32): `in` is
// false for a lane whose row is past the last, which reads and writes nothing.
template <typename Body>
__device__ __forceinline__ void for_each_row(int64_t rows, int row_lanes, Body body) {
  const int lane = threadIdx.x % 32, rows_per_warp = 32 / row_lanes;
  const int row_lane = lane % row_lanes, sub_row = lane / row_lanes;
  for (int64_t group = blockIdx.x * static_cast<int64_t>(kWarpsPerCta) + threadIdx.x / 32; group * rows_per_warp < rows;
       group += static_cast<int64_t>(gridDim.x) * kWarpsPerCta) {
    const int64_t row = group * rows_per_warp + sub_row;
    body(row, row < rows, row_lane);
  }
}

inline bool supported(KernelDType t) { return t == KernelDType::f32 || t == KernelDType::bf16; }

// Whether element 0 of p starts a K-element piece of its dtype (so does every K-th element after it).
template <int K>
bool aligned(const void* p, KernelDType t) {
  return t == KernelDType::bf16 ? vec::aligned_for<true, K>(p) : vec::aligned_for<false, K>(p);
}

// CTAs for `rows` rows at `lanes` lanes a row: 32 / lanes rows a warp.
inline int rmsnorm_grid(int64_t rows, int lanes) {
  const int rows_per_warp = 32 / lanes;
  return grid_for((rows + rows_per_warp - 1) / rows_per_warp, kWarpsPerCta);
}

// dw [cols] from partial [chunks, cols] (rmsnorm_rows_per_chunk rows a chunk), in fused_ops.cuh's order
// (kDwRuns); fused_ops.cu.
void launch_sum_chunks(const float* partial, int64_t chunks, int64_t cols, float* dw, cudaStream_t stream);

}  // namespace qwen3::kernels::rows
