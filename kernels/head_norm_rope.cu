// The q/k norms and RoPE as one pass each way: a head row [head_dim] normalized, scaled and rotated in registers,
// by the element rules of fused_ops.cuh; the weight gradient's chunks summed as fused_ops.cu sums any norm's.
// Layout of work and why: kernels/fused_ops.md ("The q/k norms with RoPE").
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "fused_ops.cuh"
#include "fused_rows.cuh"
#include "qwen3_kernels.h"
#include "vector_access.cuh"

namespace qwen3::kernels {
namespace {

namespace f = fused;
using namespace rows;

// A lane takes a piece of 8 elements (fused::head_norm_rope_lanes lanes a row: 16 for 128), as the RMSNorm kernels'
// vector path takes a narrow row, so the sum of squares meets by the same butterfly; a piece's RoPE partners
// (head_dim / 2 further on, or back) are the piece of the lane half a row away (lane ^ lanes / 2), read by a
// shuffle. Each value is the one the separate kernels store between them (the norm's output going into RoPE,
// RoPE backward's gradient going into the norm's), so the outputs are their bytes, and the normalized row never
// goes to memory: forward reads x once and writes y once, backward reads dy and x once and writes dx once.
//
// Each lane computes only its own elements' RoPE outputs, from the tables at its own columns (fused::rope_lane:
// forward the partner's value comes by the shuffle; backward the partner's sine term, fused::rope_lane_term),
// where each lane made both outputs of every pair from four tables and kept one: half the rounding arithmetic
// and half the table loads (the third round's ncu: 79 and 95 instructions an element, too many for the few warps
// their registers left to hide their latency; kernels/fused_ops.md).

// The tables at this lane's own 8 columns of the row's position.
struct RopePieceTables {
  float c[kVec], s[kVec];
};

__device__ __forceinline__ void load_rope_piece_tables(const float* cos, const float* sin, int64_t table_row,
                                                       int64_t head_dim, int64_t c, RopePieceTables& t) {
  const int64_t a = table_row * head_dim + c;
  vec::load<false, kVec>(cos, a, t.c);
  vec::load<false, kVec>(sin, a, t.s);
}

// The table row of a head row (rows = (batch, seq, heads) flattened): its token's position. `narrow`: every row
// index fits 32 bits (the launcher checks), so the two divisions are 32-bit ones, a fraction of the instructions
// of the 64-bit ones the GPU emulates (as rope_kernel's Index).
__device__ __forceinline__ int64_t table_row_of(int64_t row, int64_t heads, int64_t table_rows, bool narrow) {
  if (narrow)
    return (static_cast<uint32_t>(row) / static_cast<uint32_t>(heads)) % static_cast<uint32_t>(table_rows);
  return (row / heads) % table_rows;
}

// x, y [rows, head_dim] with rows = (batch, seq, heads) flattened; the table row of a row: its token's position.
template <bool kBf16, bool kBf16Weight>
__global__ void __launch_bounds__(kThreads) head_norm_rope_forward_kernel(const void* x, const void* w, int64_t rows,
                                                                          int64_t head_dim, int64_t heads, float eps,
                                                                          const float* cos, const float* sin,
                                                                          int64_t table_rows, void* y, float* rstd,
                                                                          int row_lanes, int narrow) {
  const int half_lanes = row_lanes / 2;
  for_each_row(rows, row_lanes, [&](int64_t row, bool in, int row_lane) {
    const int64_t c = static_cast<int64_t>(row_lane) * kVec, base = row * head_dim;
    const bool first = row_lane < half_lanes;
    float v[kVec] = {}, wv[kVec], out[kVec];
    if (in) vec::load<kBf16, kVec>(x, base + c, v);
    RopePieceTables t;  // loaded before the sum's shuffles, so its latency hides behind them
    load_rope_piece_tables(cos, sin, in ? table_row_of(row, heads, table_rows, narrow != 0) : 0, head_dim, c, t);
    vec::load<kBf16Weight, kVec>(w, c, wv);
    float squares = 0.0f;
    for (int k = 0; k < kVec; ++k) squares = fmaf(v[k], v[k], squares);
    const float r = f::rmsnorm_rstd(row_sum(squares, row_lanes), head_dim, eps);
    for (int k = 0; k < kVec; ++k) v[k] = f::rmsnorm_output<kBf16>(v[k], r, wv[k]);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float partner = __shfl_xor_sync(0xFFFFFFFFu, v[k], half_lanes);
      out[k] = f::rope_lane<kBf16>(v[k], partner, t.c[k], t.s[k], first);
    }
    if (!in) return;
    vec::store<kBf16, kVec>(y, base + c, out);
    if (row_lane == 0) rstd[row] = r;
  });
}

// dx and the weight gradient's partial sums: a CTA takes whole chunks of rows (rmsnorm_rows_per_chunk), in waves of
// kWarpsPerCta * 32 / lanes rows; each wave's dw terms go to shared memory, where thread j (j < head_dim) adds
// column j's in row order, so partial[chunk][j] is the sum rmsnorm_dw_partial_kernel forms, bit for bit, and
// sum_chunks_kernel finishes it as for any norm.
template <bool kBf16, bool kBf16Weight>
__global__ void __launch_bounds__(kThreads) head_norm_rope_backward_kernel(
    const void* dy, const void* x, const void* w, const float* rstd, int64_t rows, int64_t head_dim, int64_t heads,
    const float* cos, const float* sin, int64_t table_rows, int64_t rows_per_chunk, int64_t chunks, void* dx,
    float* partial, int row_lanes, int narrow) {
  // A wave's terms: (32 / lanes rows a warp) x (8 lanes x 8 elements a row) = kVec x 32 a warp, whatever the width.
  __shared__ float terms[kWarpsPerCta * 32 * kVec];
  const int lane = threadIdx.x % 32, rows_per_warp = 32 / row_lanes;
  const int row_lane = lane % row_lanes, half_lanes = row_lanes / 2;
  const int local = static_cast<int>(threadIdx.x / 32) * rows_per_warp + lane / row_lanes;  // its row in a wave
  const int64_t rows_per_wave = static_cast<int64_t>(kWarpsPerCta) * rows_per_warp;
  const int64_t c = static_cast<int64_t>(row_lane) * kVec;
  const bool first = row_lane < half_lanes;
  float wv[kVec];
  vec::load<kBf16Weight, kVec>(w, c, wv);
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int64_t first_row = chunk * rows_per_chunk;
    const int64_t last = first_row + rows_per_chunk < rows ? first_row + rows_per_chunk : rows;
    float sum = 0.0f;  // column threadIdx.x's partial
    for (int64_t wave = first_row; wave < last; wave += rows_per_wave) {
      const int64_t row = wave + local, base = row * head_dim;
      const bool in = row < last;
      float dyv[kVec] = {}, xv[kVec] = {}, g[kVec], out[kVec];
      if (in) vec::load<kBf16, kVec>(dy, base + c, dyv);
      if (in) vec::load<kBf16, kVec>(x, base + c, xv);
      const float r = in ? rstd[row] : 0.0f;
      RopePieceTables t;
      load_rope_piece_tables(cos, sin, in ? table_row_of(row, heads, table_rows, narrow != 0) : 0, head_dim, c, t);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {  // g: the gradient reaching the norm's output
        const float partner_term = __shfl_xor_sync(0xFFFFFFFFu, f::rope_lane_term<kBf16>(dyv[k], t.s[k]), half_lanes);
        g[k] = f::rope_lane_backward<kBf16>(dyv[k], partner_term, t.c[k], first);
      }
      float dot = 0.0f;
      for (int k = 0; k < kVec; ++k) dot = fmaf(f::rmsnorm_grad_n<kBf16>(g[k], wv[k]), f::mul_rn(xv[k], r), dot);
      const float mean = row_sum(dot, row_lanes) / static_cast<float>(head_dim);
      for (int k = 0; k < kVec; ++k) {
        const float n = f::mul_rn(xv[k], r);
        out[k] = f::rmsnorm_dx(f::rmsnorm_grad_n<kBf16>(g[k], wv[k]), n, mean, r);
        terms[local * head_dim + c + k] = f::rmsnorm_dw_term<kBf16>(g[k], n);
      }
      if (in) vec::store<kBf16, kVec>(dx, base + c, out);
      __syncthreads();
      if (threadIdx.x < head_dim) {
        const int64_t wave_rows = last - wave < rows_per_wave ? last - wave : rows_per_wave;
        for (int64_t i = 0; i < wave_rows; ++i) sum = f::add_rn(sum, terms[i * head_dim + threadIdx.x]);
      }
      __syncthreads();
    }
    if (threadIdx.x < head_dim) partial[chunk * head_dim + threadIdx.x] = sum;
  }
}

}  // namespace

namespace {
// The fused q/k norm + RoPE's common checks: dtypes, a width it takes, the tables' rows, every pointer aligned
// for 8-element pieces.
bool head_norm_rope_arguments(KernelDType x_type, KernelDType w_type, int64_t batch, int64_t seq, int64_t heads,
                              int64_t head_dim, int64_t table_rows, std::initializer_list<const void*> activations,
                              const void* w, const float* cos, const float* sin) {
  bool ok = supported(x_type) && supported(w_type) && fused::head_norm_rope_lanes(head_dim) > 0 && batch >= 0 &&
            seq >= 0 && heads >= 0 && w && cos && sin && (table_rows == seq || table_rows == batch * seq) &&
            aligned<kVec>(w, w_type) && aligned<kVec>(cos, KernelDType::f32) && aligned<kVec>(sin, KernelDType::f32);
  for (const void* p : activations) ok = ok && p && aligned<kVec>(p, x_type);
  return ok;
}
// Whether every row index fits 32 bits, for table_row_of's narrow divisions (only rows below `rows` are divided;
// heads and table rows are at most the rows).
int rows_fit_32_bits(int64_t rows) { return rows <= static_cast<int64_t>(UINT32_MAX) ? 1 : 0; }
}  // namespace

int launch_head_norm_rope_forward(const void* x, KernelDType x_type, const void* w, KernelDType w_type, int64_t batch,
                                  int64_t seq, int64_t heads, int64_t head_dim, float eps, const float* cos,
                                  const float* sin, int64_t table_rows, void* y, float* rstd, void* stream) {
  if (!head_norm_rope_arguments(x_type, w_type, batch, seq, heads, head_dim, table_rows, {x, y}, w, cos, sin) || !rstd)
    return static_cast<int>(cudaErrorInvalidValue);
  const int64_t rows = batch * seq * heads;
  if (rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const int lanes = fused::head_norm_rope_lanes(head_dim);
  const int grid = rmsnorm_grid(rows, lanes);
  const int narrow = rows_fit_32_bits(rows);
  const bool bx = x_type == KernelDType::bf16, bw = w_type == KernelDType::bf16;
#define QWEN3_HEAD_NORM_ROPE_FORWARD(BX, BW)                                                                    \
  head_norm_rope_forward_kernel<BX, BW><<<grid, kThreads, 0, s>>>(x, w, rows, head_dim, heads, eps, cos, sin, \
                                                                  table_rows, y, rstd, lanes, narrow)
  if (bx && bw) QWEN3_HEAD_NORM_ROPE_FORWARD(true, true);
  else if (bx) QWEN3_HEAD_NORM_ROPE_FORWARD(true, false);
  else if (bw) QWEN3_HEAD_NORM_ROPE_FORWARD(false, true);
  else QWEN3_HEAD_NORM_ROPE_FORWARD(false, false);
#undef QWEN3_HEAD_NORM_ROPE_FORWARD
  return static_cast<int>(cudaGetLastError());
}

int launch_head_norm_rope_backward(const void* dy, const void* x, KernelDType x_type, const void* w, KernelDType w_type,
                                   const float* rstd, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                   const float* cos, const float* sin, int64_t table_rows, void* dx, float* dw,
                                   float* workspace, void* stream) {
  if (!head_norm_rope_arguments(x_type, w_type, batch, seq, heads, head_dim, table_rows, {dy, x, dx}, w, cos, sin) ||
      !rstd || !dw || !workspace)
    return static_cast<int>(cudaErrorInvalidValue);
  const int64_t rows = batch * seq * heads;
  const auto s = static_cast<cudaStream_t>(stream);
  const int lanes = fused::head_norm_rope_lanes(head_dim);
  const int narrow = rows_fit_32_bits(rows);
  const int64_t per_chunk = rmsnorm_rows_per_chunk(rows);
  const int64_t chunks = rmsnorm_backward_workspace_floats(rows, head_dim) / head_dim;
  const bool bx = x_type == KernelDType::bf16, bw = w_type == KernelDType::bf16;
  const auto grid = static_cast<unsigned>(chunks);  // at most 65,535 (rmsnorm_rows_per_chunk)
#define QWEN3_HEAD_NORM_ROPE_BACKWARD(BX, BW)                                                                      \
  head_norm_rope_backward_kernel<BX, BW><<<grid, kThreads, 0, s>>>(dy, x, w, rstd, rows, head_dim, heads, cos, sin, \
                                                                   table_rows, per_chunk, chunks, dx, workspace, lanes, \
                                                                   narrow)
  if (bx && bw) QWEN3_HEAD_NORM_ROPE_BACKWARD(true, true);
  else if (bx) QWEN3_HEAD_NORM_ROPE_BACKWARD(true, false);
  else if (bw) QWEN3_HEAD_NORM_ROPE_BACKWARD(false, true);
  else QWEN3_HEAD_NORM_ROPE_BACKWARD(false, false);
#undef QWEN3_HEAD_NORM_ROPE_BACKWARD
  rows::launch_sum_chunks(workspace, chunks, head_dim, dw, s);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace qwen3::kernels
