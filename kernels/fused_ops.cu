// RMSNorm forward/backward, RoPE in place, SwiGLU forward/backward: one pass each over the activations, by the
// element rules of fused_ops.cuh (the q/k norms with RoPE: head_norm_rope.cu). Layout of work and why:
// kernels/fused_ops.md.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "fused_ops.cuh"
#include "fused_rows.cuh"
#include "qwen3_kernels.h"
#include "rmsnorm_wide_rows.cuh"
#include "vector_access.cuh"

namespace qwen3::kernels {
namespace {

namespace f = fused;
using namespace rows;  // kThreads, kVec, row_sum, for_each_row, grid_for, supported, aligned, rmsnorm_grid
// Columns a thread of the RMSNorm weight-gradient kernel sums (a 4-byte bf16 pair).
constexpr int kDwCols = 2;

// ---- RMSNorm: a warp per row, or per two or more narrow rows (the rows are tokens, or tokens x heads for the
// q/k norms) -------------------------------------------------------------------------------------------------------

template <bool kBf16, bool kBf16Weight>
__global__ void __launch_bounds__(kThreads) rmsnorm_forward_kernel(const void* x, const void* w, int64_t rows,
                                                                   int64_t cols, float eps, void* y, float* rstd,
                                                                   int vectorized, int row_lanes) {
  const int lane = threadIdx.x % 32;
  for_each_row(rows, row_lanes, [&](int64_t row, bool in, int row_lane) {
    const int64_t base = row * cols;
    float squares = 0.0f;
    if (in && vectorized) {
      // Unrolled: several 16-byte loads of the row in flight a lane, not one round trip an iteration.
#pragma unroll 4
      for (int64_t c = row_lane * kVec; c < cols; c += static_cast<int64_t>(row_lanes) * kVec) {
        float v[kVec];
        vec::load<kBf16, kVec>(x, base + c, v);
        for (int k = 0; k < kVec; ++k) squares = fmaf(v[k], v[k], squares);
      }
    } else if (in) {
      for (int64_t c = lane; c < cols; c += 32) {
        const float v = f::load<kBf16>(x, base + c);
        squares = fmaf(v, v, squares);
      }
    }
    const float r = f::rmsnorm_rstd(row_sum(squares, row_lanes), cols, eps);
    if (!in) return;
    if (vectorized) {
      // Unrolled: several 16-byte loads of the row in flight a lane, not one round trip an iteration.
#pragma unroll 4
      for (int64_t c = row_lane * kVec; c < cols; c += static_cast<int64_t>(row_lanes) * kVec) {
        float v[kVec], wv[kVec];
        vec::load<kBf16, kVec>(x, base + c, v);
        vec::load<kBf16Weight, kVec>(w, c, wv);
        for (int k = 0; k < kVec; ++k) v[k] = f::rmsnorm_output<kBf16>(v[k], r, wv[k]);
        vec::store<kBf16, kVec>(y, base + c, v);
      }
    } else {
      for (int64_t c = lane; c < cols; c += 32)
        f::store<kBf16>(y, base + c, f::rmsnorm_output<kBf16>(f::load<kBf16>(x, base + c), r, f::load<kBf16Weight>(w, c)));
    }
    if (row_lane == 0) rstd[row] = r;
  });
}

template <bool kBf16, bool kBf16Weight>
// dx_add (nullable, x's dtype): a gradient the row's x also gets by another path (the residual stream's), added to
// dx as autograd would add the two: the norm's dx rounded to the activation dtype, then the sum rounded.
__global__ void __launch_bounds__(kThreads) rmsnorm_dx_kernel(const void* dy, const void* x, const void* w,
                                                              const float* rstd, int64_t rows, int64_t cols, void* dx,
                                                              const void* dx_add, int vectorized, int row_lanes) {
  const int lane = threadIdx.x % 32;
  for_each_row(rows, row_lanes, [&](int64_t row, bool in, int row_lane) {
    const int64_t base = row * cols;
    const float r = in ? rstd[row] : 0.0f;
    float dot = 0.0f;
    // x, dy and w of 8 columns of the row (the vector path reads them in both passes).
    const auto load_piece = [&](int64_t c, float(&xv)[kVec], float(&dyv)[kVec], float(&wv)[kVec]) {
      vec::load<kBf16, kVec>(x, base + c, xv);
      vec::load<kBf16, kVec>(dy, base + c, dyv);
      vec::load<kBf16Weight, kVec>(w, c, wv);
    };
    if (in && vectorized) {
      // Unrolled: several 16-byte loads of the row in flight a lane, not one round trip an iteration.
#pragma unroll 4
      for (int64_t c = row_lane * kVec; c < cols; c += static_cast<int64_t>(row_lanes) * kVec) {
        float xv[kVec], dyv[kVec], wv[kVec];
        load_piece(c, xv, dyv, wv);
        for (int k = 0; k < kVec; ++k) dot = fmaf(f::rmsnorm_grad_n<kBf16>(dyv[k], wv[k]), f::mul_rn(xv[k], r), dot);
      }
    } else if (in) {
      for (int64_t c = lane; c < cols; c += 32) {
        const float n = f::mul_rn(f::load<kBf16>(x, base + c), r);
        dot = fmaf(f::rmsnorm_grad_n<kBf16>(f::load<kBf16>(dy, base + c), f::load<kBf16Weight>(w, c)), n, dot);
      }
    }
    const float mean = row_sum(dot, row_lanes) / static_cast<float>(cols);
    if (!in) return;
    if (vectorized) {
      // Unrolled: several 16-byte loads of the row in flight a lane, not one round trip an iteration.
#pragma unroll 4
      for (int64_t c = row_lane * kVec; c < cols; c += static_cast<int64_t>(row_lanes) * kVec) {
        float xv[kVec], dyv[kVec], wv[kVec];
        load_piece(c, xv, dyv, wv);
        for (int k = 0; k < kVec; ++k)
          xv[k] = f::rmsnorm_dx(f::rmsnorm_grad_n<kBf16>(dyv[k], wv[k]), f::mul_rn(xv[k], r), mean, r);
        if (dx_add) {
          float addv[kVec];
          vec::load<kBf16, kVec>(dx_add, base + c, addv);
          for (int k = 0; k < kVec; ++k) xv[k] = f::add_rn(f::round_to<kBf16>(xv[k]), addv[k]);
        }
        vec::store<kBf16, kVec>(dx, base + c, xv);
      }
    } else {
      for (int64_t c = lane; c < cols; c += 32) {
        const float n = f::mul_rn(f::load<kBf16>(x, base + c), r);
        const float g = f::rmsnorm_grad_n<kBf16>(f::load<kBf16>(dy, base + c), f::load<kBf16Weight>(w, c));
        const float d = f::rmsnorm_dx(g, n, mean, r);
        f::store<kBf16>(dx, base + c, dx_add ? f::add_rn(f::round_to<kBf16>(d), f::load<kBf16>(dx_add, base + c)) : d);
      }
    }
  });
}

// The weight's gradient, deterministically (the order: fused_ops.cuh, kDwRuns): a thread per (chunk, pair of
// columns) sums its rows of the chunk in order into partial[chunk][col]; a second kernel sums the chunks. The
// threads are numbered chunk by chunk, pair by pair, so a CTA covers consecutive pairs of a chunk and then the next
// chunk's: a narrow norm (the q/k norms: 128 columns, 64 pairs) fills whole CTAs, where a CTA a chunk left three
// quarters of them idle. Chunks of 32 rows (more at many rows: rmsnorm_rows_per_chunk) give a 2048-token
// [2048, 2560] norm 320 CTAs.
template <bool kBf16>
__global__ void __launch_bounds__(kThreads) rmsnorm_dw_partial_kernel(const void* dy, const void* x, const float* rstd,
                                                                      int64_t rows, int64_t cols, int64_t rows_per_chunk,
                                                                      int64_t chunks, int64_t pairs_across,
                                                                      float* partial, int vectorized) {
  const int64_t item = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (item >= chunks * pairs_across) return;
  const int64_t chunk = item / pairs_across;
  const int64_t col = (item - chunk * pairs_across) * kDwCols;
  const int64_t first = chunk * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float sum[kDwCols] = {};
  const int pair = vectorized && col + 1 < cols;
  // Unrolled: eight rows' loads in flight a thread where there was about one (the adds stay in row order).
#pragma unroll 8
  for (int64_t row = first; row < last; ++row) {
    const float r = rstd[row];
    float dyv[kDwCols], xv[kDwCols];
    if (pair) {
      vec::load<kBf16, kDwCols>(dy, row * cols + col, dyv);
      vec::load<kBf16, kDwCols>(x, row * cols + col, xv);
    } else {
      for (int k = 0; k < kDwCols; ++k) {
        const bool in = col + k < cols;
        dyv[k] = in ? f::load<kBf16>(dy, row * cols + col + k) : 0.0f;
        xv[k] = in ? f::load<kBf16>(x, row * cols + col + k) : 0.0f;
      }
    }
    for (int k = 0; k < kDwCols; ++k) sum[k] = f::add_rn(sum[k], f::rmsnorm_dw_term<kBf16>(dyv[k], f::mul_rn(xv[k], r)));
  }
  for (int k = 0; k < kDwCols; ++k)
    if (col + k < cols) partial[chunk * cols + col + k] = sum[k];
}

// A CTA per 32 columns: warp r (threadIdx.y) sums run r of the chunks for its 32 columns (a coalesced 128-byte row
// of partials a chunk), then warp 0 adds the runs in order. 2,048 chunks take 64 dependent loads and 32 adds,
// where one thread a column walked all 2,048.
constexpr int kSumColumns = 32;
__global__ void __launch_bounds__(kSumColumns * f::kDwRuns) sum_chunks_kernel(const float* partial, int64_t chunks,
                                                                              int64_t cols, float* dw) {
  __shared__ float run_sums[f::kDwRuns][kSumColumns];
  const int64_t col = blockIdx.x * static_cast<int64_t>(kSumColumns) + threadIdx.x;
  const int run = static_cast<int>(threadIdx.y);
  float sum = 0.0f;
  if (col < cols) {
    const int64_t last = f::dw_run_first(chunks, run + 1);
    for (int64_t chunk = f::dw_run_first(chunks, run); chunk < last; ++chunk)
      sum = f::add_rn(sum, partial[chunk * cols + col]);
  }
  run_sums[run][threadIdx.x] = sum;
  __syncthreads();
  if (run == 0 && col < cols) {
    float total = 0.0f;
    for (int r = 0; r < f::kDwRuns; ++r) total = f::add_rn(total, run_sums[r][threadIdx.x]);
    dw[col] = total;
  }
}

// ---- RoPE: a thread per (first half, second half) pair of x [batch, seq, heads, head_dim] (out may be x) -----------
// Vector path (half a multiple of 4, x, out and the tables aligned): a thread takes 4 consecutive pairs, reading
// 8 bytes of bf16 (16 of fp32) from each half and 16 bytes of each table.

constexpr int kRopePairs = 4;

// Index: uint32_t where every element offset of x and of the tables fits (the launcher checks), else int64_t:
// the item's three divisions (pair in its head, head row, table row) in 32 bits take a fraction of the
// instructions of 64-bit ones, which the GPU emulates.
template <bool kBf16, typename Index>
__global__ void __launch_bounds__(kThreads) rope_kernel(const void* x, void* out, int64_t batch, int64_t seq, int64_t heads,
                                                        int64_t head_dim, const float* cos, const float* sin,
                                                        int64_t table_rows, int backward, int vectorized) {
  const auto half = static_cast<Index>(head_dim / 2), heads_i = static_cast<Index>(heads);
  const auto table_rows_i = static_cast<Index>(table_rows), head_dim_i = static_cast<Index>(head_dim);
  const Index per_item = vectorized ? kRopePairs : 1;
  const auto items = static_cast<Index>(batch * seq * heads * (head_dim / 2) / per_item);
  for (Index item = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; item < items;
       item += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index p = item * per_item;
    const Index i = p % half, head_row = p / half;  // head_row = (b, t, h) flattened
    const Index t = (head_row / heads_i) % table_rows_i;  // the token's position (b, t): its table row
    const int64_t a = static_cast<int64_t>(head_row) * head_dim_i + i, b = a + half;
    const int64_t ta = static_cast<int64_t>(t) * head_dim_i + i, tb = ta + half;
    if (vectorized) {
      float x1[kRopePairs], x2[kRopePairs], c1[kRopePairs], s1[kRopePairs], c2[kRopePairs], s2[kRopePairs];
      vec::load<kBf16, kRopePairs>(x, a, x1);
      vec::load<kBf16, kRopePairs>(x, b, x2);
      vec::load<false, kRopePairs>(cos, ta, c1);
      vec::load<false, kRopePairs>(sin, ta, s1);
      vec::load<false, kRopePairs>(cos, tb, c2);
      vec::load<false, kRopePairs>(sin, tb, s2);
      for (int k = 0; k < kRopePairs; ++k) {
        if (backward)
          f::rope_pair_backward<kBf16>(x1[k], x2[k], c1[k], s1[k], c2[k], s2[k]);
        else
          f::rope_pair<kBf16>(x1[k], x2[k], c1[k], s1[k], c2[k], s2[k]);
      }
      vec::store<kBf16, kRopePairs>(out, a, x1);
      vec::store<kBf16, kRopePairs>(out, b, x2);
    } else {
      float x1 = f::load<kBf16>(x, a), x2 = f::load<kBf16>(x, b);
      if (backward)
        f::rope_pair_backward<kBf16>(x1, x2, cos[ta], sin[ta], cos[tb], sin[tb]);
      else
        f::rope_pair<kBf16>(x1, x2, cos[ta], sin[ta], cos[tb], sin[tb]);
      f::store<kBf16>(out, a, x1);
      f::store<kBf16>(out, b, x2);
    }
  }
}

// ---- SwiGLU: 8 elements a thread where every pointer is aligned for them (the last n % 8 one a thread), else
// one a thread ------------------------------------------------------------------------------------------------------

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) swiglu_forward_kernel(const void* gate, const void* up, void* out, int64_t n,
                                                                  int vectorized) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x, first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t pieces = vectorized ? n / kVec : 0;
  for (int64_t piece = first; piece < pieces; piece += stride) {
    float g[kVec], u[kVec];
    vec::load<kBf16, kVec>(gate, piece * kVec, g);
    vec::load<kBf16, kVec>(up, piece * kVec, u);
    for (int k = 0; k < kVec; ++k) g[k] = f::swiglu<kBf16>(g[k], u[k]);
    vec::store<kBf16, kVec>(out, piece * kVec, g);
  }
  for (int64_t i = pieces * kVec + first; i < n; i += stride)
    f::store<kBf16>(out, i, f::swiglu<kBf16>(f::load<kBf16>(gate, i), f::load<kBf16>(up, i)));
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) swiglu_backward_kernel(const void* dout, const void* gate, const void* up,
                                                                   void* dgate, void* dup, int64_t n, int vectorized) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x, first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t pieces = vectorized ? n / kVec : 0;
  for (int64_t piece = first; piece < pieces; piece += stride) {
    float d[kVec], g[kVec], u[kVec], dg[kVec], du[kVec];
    vec::load<kBf16, kVec>(dout, piece * kVec, d);
    vec::load<kBf16, kVec>(gate, piece * kVec, g);
    vec::load<kBf16, kVec>(up, piece * kVec, u);
    for (int k = 0; k < kVec; ++k) f::swiglu_backward<kBf16>(d[k], g[k], u[k], dg[k], du[k]);
    vec::store<kBf16, kVec>(dgate, piece * kVec, dg);
    vec::store<kBf16, kVec>(dup, piece * kVec, du);
  }
  for (int64_t i = pieces * kVec + first; i < n; i += stride) {
    float dg, du;
    f::swiglu_backward<kBf16>(f::load<kBf16>(dout, i), f::load<kBf16>(gate, i), f::load<kBf16>(up, i), dg, du);
    f::store<kBf16>(dgate, i, dg);
    f::store<kBf16>(dup, i, du);
  }
}

}  // namespace

namespace rows {
void launch_sum_chunks(const float* partial, int64_t chunks, int64_t cols, float* dw, cudaStream_t stream) {
  sum_chunks_kernel<<<static_cast<unsigned>((cols + kSumColumns - 1) / kSumColumns), dim3(kSumColumns, f::kDwRuns), 0,
                      stream>>>(partial, chunks, cols, dw);
}
}  // namespace rows

int launch_rmsnorm_forward(const void* x, KernelDType x_type, const void* w, KernelDType w_type, int64_t rows,
                           int64_t cols, float eps, void* y, float* rstd, void* stream) {
  if (!supported(x_type) || !supported(w_type) || rows < 0 || cols <= 0 || !x || !w || !y || !rstd)
    return static_cast<int>(cudaErrorInvalidValue);
  if (rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const bool bx = x_type == KernelDType::bf16, bw = w_type == KernelDType::bf16;
  const int v = cols % kVec == 0 && aligned<kVec>(x, x_type) && aligned<kVec>(y, x_type) && aligned<kVec>(w, w_type);
  if (takes_wide_rows(cols, v)) {  // a CTA a row (rmsnorm_wide_rows.cuh)
    const int grid = wide_rows_grid(rows);
    if (bx && bw) rmsnorm_forward_wide_kernel<true, true><<<grid, kWideThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd);
    else if (bx) rmsnorm_forward_wide_kernel<true, false><<<grid, kWideThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd);
    else if (bw) rmsnorm_forward_wide_kernel<false, true><<<grid, kWideThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd);
    else rmsnorm_forward_wide_kernel<false, false><<<grid, kWideThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd);
    return static_cast<int>(cudaGetLastError());
  }
  const int lanes = rmsnorm_row_lanes(cols, v);
  const int grid = rmsnorm_grid(rows, lanes);
  if (bx && bw) rmsnorm_forward_kernel<true, true><<<grid, kThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd, v, lanes);
  else if (bx) rmsnorm_forward_kernel<true, false><<<grid, kThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd, v, lanes);
  else if (bw) rmsnorm_forward_kernel<false, true><<<grid, kThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd, v, lanes);
  else rmsnorm_forward_kernel<false, false><<<grid, kThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd, v, lanes);
  return static_cast<int>(cudaGetLastError());
}

int rmsnorm_row_lanes(int64_t cols, int vectorized) {
  if (!vectorized) return 32;
  int lanes = 1;
  while (lanes < 32 && static_cast<int64_t>(lanes) * kVec < cols) lanes *= 2;
  return lanes;
}

int64_t rmsnorm_rows_per_chunk(int64_t rows) {
  // 32 rows a chunk, more where that would need more than 65,535 chunks (which bounds the workspace).
  const int64_t at_limit = (rows + 65534) / 65535;
  return at_limit > 32 ? at_limit : 32;
}

int64_t rmsnorm_backward_workspace_floats(int64_t rows, int64_t cols) {
  const int64_t per_chunk = rmsnorm_rows_per_chunk(rows);
  const int64_t chunks = (rows + per_chunk - 1) / per_chunk;
  return (chunks < 1 ? 1 : chunks) * cols;
}

int launch_rmsnorm_backward(const void* dy, const void* x, KernelDType x_type, const void* w, KernelDType w_type,
                            const float* rstd, int64_t rows, int64_t cols, void* dx, float* dw, float* workspace,
                            void* stream, const void* dx_add) {
  if (!supported(x_type) || !supported(w_type) || rows < 0 || cols <= 0 || !dy || !x || !w || !rstd || !dx || !dw ||
      !workspace)
    return static_cast<int>(cudaErrorInvalidValue);
  const auto s = static_cast<cudaStream_t>(stream);
  const bool bx = x_type == KernelDType::bf16, bw = w_type == KernelDType::bf16;
  if (rows > 0) {
    const int v = cols % kVec == 0 && aligned<kVec>(x, x_type) && aligned<kVec>(dy, x_type) &&
                  aligned<kVec>(dx, x_type) && aligned<kVec>(w, w_type) && (!dx_add || aligned<kVec>(dx_add, x_type));
    const int lanes = rmsnorm_row_lanes(cols, v);
    const int grid = rmsnorm_grid(rows, lanes);
    if (takes_wide_rows(cols, v)) {  // a CTA a row (rmsnorm_wide_rows.cuh)
      const int wide_grid = wide_rows_grid(rows);
      if (bx && bw) rmsnorm_dx_wide_kernel<true, true><<<wide_grid, kWideThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx, dx_add);
      else if (bx) rmsnorm_dx_wide_kernel<true, false><<<wide_grid, kWideThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx, dx_add);
      else if (bw) rmsnorm_dx_wide_kernel<false, true><<<wide_grid, kWideThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx, dx_add);
      else rmsnorm_dx_wide_kernel<false, false><<<wide_grid, kWideThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx, dx_add);
    } else if (bx && bw) {
      rmsnorm_dx_kernel<true, true><<<grid, kThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx, dx_add, v, lanes);
    } else if (bx) {
      rmsnorm_dx_kernel<true, false><<<grid, kThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx, dx_add, v, lanes);
    } else if (bw) {
      rmsnorm_dx_kernel<false, true><<<grid, kThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx, dx_add, v, lanes);
    } else {
      rmsnorm_dx_kernel<false, false><<<grid, kThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx, dx_add, v, lanes);
    }
  }
  const int64_t per_chunk = rmsnorm_rows_per_chunk(rows);
  const int64_t chunks = rmsnorm_backward_workspace_floats(rows, cols) / cols;
  const int64_t pairs_across = (cols + kDwCols - 1) / kDwCols;
  const auto partial_grid = static_cast<unsigned>((chunks * pairs_across + kThreads - 1) / kThreads);
  const int pairs = cols % kDwCols == 0 && aligned<kDwCols>(dy, x_type) && aligned<kDwCols>(x, x_type);
  if (bx)
    rmsnorm_dw_partial_kernel<true><<<partial_grid, kThreads, 0, s>>>(dy, x, rstd, rows, cols, per_chunk, chunks,
                                                                      pairs_across, workspace, pairs);
  else
    rmsnorm_dw_partial_kernel<false><<<partial_grid, kThreads, 0, s>>>(dy, x, rstd, rows, cols, per_chunk, chunks,
                                                                       pairs_across, workspace, pairs);
  rows::launch_sum_chunks(workspace, chunks, cols, dw, s);
  return static_cast<int>(cudaGetLastError());
}

int launch_rope(const void* x, void* out, KernelDType type, int64_t batch, int64_t seq, int64_t heads,
                int64_t head_dim, const float* cos, const float* sin, int64_t table_rows, int backward, void* stream) {
  if (!supported(type) || batch < 0 || seq < 0 || heads < 0 || head_dim <= 0 || head_dim % 2 != 0 || !x || !out ||
      !cos || !sin || (table_rows != seq && table_rows != batch * seq))
    return static_cast<int>(cudaErrorInvalidValue);
  const int64_t half = head_dim / 2, pairs = batch * seq * heads * half;
  if (pairs == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const int v = half % kRopePairs == 0 && aligned<kRopePairs>(x, type) && aligned<kRopePairs>(out, type) &&
                aligned<kRopePairs>(cos, KernelDType::f32) && aligned<kRopePairs>(sin, KernelDType::f32);
  const int64_t items = pairs / (v ? kRopePairs : 1);
  // 32-bit indices where the elements (and the grid-stride loop's last step past them) fit.
  const bool narrow = 2 * pairs <= INT32_MAX && table_rows * head_dim <= INT32_MAX;
  const int grid = grid_for(items, kThreads);
  if (type == KernelDType::bf16 && narrow)
    rope_kernel<true, uint32_t><<<grid, kThreads, 0, s>>>(x, out, batch, seq, heads, head_dim, cos, sin, table_rows, backward, v);
  else if (type == KernelDType::bf16)
    rope_kernel<true, int64_t><<<grid, kThreads, 0, s>>>(x, out, batch, seq, heads, head_dim, cos, sin, table_rows, backward, v);
  else if (narrow)
    rope_kernel<false, uint32_t><<<grid, kThreads, 0, s>>>(x, out, batch, seq, heads, head_dim, cos, sin, table_rows, backward, v);
  else
    rope_kernel<false, int64_t><<<grid, kThreads, 0, s>>>(x, out, batch, seq, heads, head_dim, cos, sin, table_rows, backward, v);
  return static_cast<int>(cudaGetLastError());
}

int launch_swiglu_forward(const void* gate, const void* up, void* out, KernelDType type, int64_t n, void* stream) {
  if (!supported(type) || n < 0 || !gate || !up || !out) return static_cast<int>(cudaErrorInvalidValue);
  if (n == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const int v = aligned<kVec>(gate, type) && aligned<kVec>(up, type) && aligned<kVec>(out, type);
  const int64_t items = v ? (n + kVec - 1) / kVec : n;
  if (type == KernelDType::bf16)
    swiglu_forward_kernel<true><<<grid_for(items, kThreads), kThreads, 0, s>>>(gate, up, out, n, v);
  else
    swiglu_forward_kernel<false><<<grid_for(items, kThreads), kThreads, 0, s>>>(gate, up, out, n, v);
  return static_cast<int>(cudaGetLastError());
}

int launch_swiglu_backward(const void* dout, const void* gate, const void* up, void* dgate, void* dup, KernelDType type,
                           int64_t n, void* stream) {
  if (!supported(type) || n < 0 || !dout || !gate || !up || !dgate || !dup) return static_cast<int>(cudaErrorInvalidValue);
  if (n == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const int v = aligned<kVec>(dout, type) && aligned<kVec>(gate, type) && aligned<kVec>(up, type) &&
                aligned<kVec>(dgate, type) && aligned<kVec>(dup, type);
  const int64_t items = v ? (n + kVec - 1) / kVec : n;
  if (type == KernelDType::bf16)
    swiglu_backward_kernel<true><<<grid_for(items, kThreads), kThreads, 0, s>>>(dout, gate, up, dgate, dup, n, v);
  else
    swiglu_backward_kernel<false><<<grid_for(items, kThreads), kThreads, 0, s>>>(dout, gate, up, dgate, dup, n, v);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace qwen3::kernels
