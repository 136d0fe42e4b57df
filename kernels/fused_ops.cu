// RMSNorm forward/backward, RoPE in place, SwiGLU forward/backward: one pass each over the activations, by the
// element rules of fused_ops.cuh. Layout of work and why: kernels/fused_ops.md.
#include <cuda_runtime.h>

#include <cstdint>

#include "fused_ops.cuh"
#include "qwen3_kernels.h"

namespace qwen3::kernels {
namespace {

namespace f = fused;
constexpr int kThreads = 256;
constexpr int kWarpsPerCta = kThreads / 32;

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xFFFFFFFFu, x, offset);
  return x;
}

int grid_for(int64_t items, int64_t per_cta) {
  const int64_t ctas = (items + per_cta - 1) / per_cta;
  return static_cast<int>(ctas < 1 ? 1 : (ctas > 65535 ? 65535 : ctas));
}

// ---- RMSNorm: a warp per row (the rows are tokens, or tokens x heads for the q/k norms) ----------------------

template <bool kBf16, bool kBf16Weight>
__global__ void __launch_bounds__(kThreads) rmsnorm_forward_kernel(const void* x, const void* w, int64_t rows,
                                                                   int64_t cols, float eps, void* y, float* rstd) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerCta) + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarpsPerCta) {
    const int64_t base = row * cols;
    float squares = 0.0f;
    for (int64_t c = lane; c < cols; c += 32) {
      const float v = f::load<kBf16>(x, base + c);
      squares = fmaf(v, v, squares);
    }
    const float r = f::rmsnorm_rstd(warp_sum(squares), cols, eps);
    for (int64_t c = lane; c < cols; c += 32)
      f::store<kBf16>(y, base + c, f::rmsnorm_output<kBf16>(f::load<kBf16>(x, base + c), r, f::load<kBf16Weight>(w, c)));
    if (lane == 0) rstd[row] = r;
  }
}

template <bool kBf16, bool kBf16Weight>
__global__ void __launch_bounds__(kThreads) rmsnorm_dx_kernel(const void* dy, const void* x, const void* w,
                                                              const float* rstd, int64_t rows, int64_t cols, void* dx) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerCta) + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarpsPerCta) {
    const int64_t base = row * cols;
    const float r = rstd[row];
    float dot = 0.0f;
    for (int64_t c = lane; c < cols; c += 32) {
      const float n = f::mul_rn(f::load<kBf16>(x, base + c), r);
      dot = fmaf(f::rmsnorm_grad_n<kBf16>(f::load<kBf16>(dy, base + c), f::load<kBf16Weight>(w, c)), n, dot);
    }
    const float mean = warp_sum(dot) / static_cast<float>(cols);
    for (int64_t c = lane; c < cols; c += 32) {
      const float n = f::mul_rn(f::load<kBf16>(x, base + c), r);
      const float g = f::rmsnorm_grad_n<kBf16>(f::load<kBf16>(dy, base + c), f::load<kBf16Weight>(w, c));
      f::store<kBf16>(dx, base + c, f::rmsnorm_dx(g, n, mean, r));
    }
  }
}

// The weight's gradient, deterministically: a thread per column sums its rows of one chunk in order into
// partial[chunk][col]; a second kernel sums the chunks in order.
template <bool kBf16>
__global__ void __launch_bounds__(kThreads) rmsnorm_dw_partial_kernel(const void* dy, const void* x, const float* rstd,
                                                                      int64_t rows, int64_t cols, int64_t rows_per_chunk,
                                                                      float* partial) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (col >= cols) return;
  const int64_t first = chunk * rows_per_chunk;
  const int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float sum = 0.0f;
  for (int64_t row = first; row < last; ++row)
    sum = f::add_rn(sum, f::rmsnorm_dw_term<kBf16>(f::load<kBf16>(dy, row * cols + col),
                                                   f::mul_rn(f::load<kBf16>(x, row * cols + col), rstd[row])));
  partial[chunk * cols + col] = sum;
}

__global__ void __launch_bounds__(kThreads) sum_chunks_kernel(const float* partial, int64_t chunks, int64_t cols,
                                                              float* dw) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= cols) return;
  float sum = 0.0f;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) sum = f::add_rn(sum, partial[chunk * cols + col]);
  dw[col] = sum;
}

// ---- RoPE: a thread per (first half, second half) pair of x [batch, seq, heads, head_dim] (out may be x) -----------

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) rope_kernel(const void* x, void* out, int64_t batch, int64_t seq, int64_t heads,
                                                        int64_t head_dim, const float* cos, const float* sin,
                                                        int64_t table_rows, int backward) {
  const int64_t half = head_dim / 2;
  const int64_t pairs = batch * seq * heads * half;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = p % half, head_row = p / half;  // head_row = (b, t, h) flattened
    const int64_t t = (head_row / heads) % table_rows;  // the token's position (b, t): its table row
    const int64_t a = head_row * head_dim + i, b = a + half;
    float x1 = f::load<kBf16>(x, a), x2 = f::load<kBf16>(x, b);
    const float c1 = cos[t * head_dim + i], s1 = sin[t * head_dim + i];
    const float c2 = cos[t * head_dim + i + half], s2 = sin[t * head_dim + i + half];
    if (backward)
      f::rope_pair_backward<kBf16>(x1, x2, c1, s1, c2, s2);
    else
      f::rope_pair<kBf16>(x1, x2, c1, s1, c2, s2);
    f::store<kBf16>(out, a, x1);
    f::store<kBf16>(out, b, x2);
  }
}

// ---- SwiGLU: a thread per element ---------------------------------------------------------------------------------

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) swiglu_forward_kernel(const void* gate, const void* up, void* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    f::store<kBf16>(out, i, f::swiglu<kBf16>(f::load<kBf16>(gate, i), f::load<kBf16>(up, i)));
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads) swiglu_backward_kernel(const void* dout, const void* gate, const void* up,
                                                                   void* dgate, void* dup, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float dg, du;
    f::swiglu_backward<kBf16>(f::load<kBf16>(dout, i), f::load<kBf16>(gate, i), f::load<kBf16>(up, i), dg, du);
    f::store<kBf16>(dgate, i, dg);
    f::store<kBf16>(dup, i, du);
  }
}

bool supported(KernelDType t) { return t == KernelDType::f32 || t == KernelDType::bf16; }

}  // namespace

int launch_rmsnorm_forward(const void* x, KernelDType x_type, const void* w, KernelDType w_type, int64_t rows,
                           int64_t cols, float eps, void* y, float* rstd, void* stream) {
  if (!supported(x_type) || !supported(w_type) || rows < 0 || cols <= 0 || !x || !w || !y || !rstd)
    return static_cast<int>(cudaErrorInvalidValue);
  if (rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  const int grid = grid_for(rows, kWarpsPerCta);
  const bool bx = x_type == KernelDType::bf16, bw = w_type == KernelDType::bf16;
  if (bx && bw) rmsnorm_forward_kernel<true, true><<<grid, kThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd);
  else if (bx) rmsnorm_forward_kernel<true, false><<<grid, kThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd);
  else if (bw) rmsnorm_forward_kernel<false, true><<<grid, kThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd);
  else rmsnorm_forward_kernel<false, false><<<grid, kThreads, 0, s>>>(x, w, rows, cols, eps, y, rstd);
  return static_cast<int>(cudaGetLastError());
}

int64_t rmsnorm_backward_workspace_floats(int64_t rows, int64_t cols) {
  const int64_t chunks = (rows + kRmsnormRowsPerChunk - 1) / kRmsnormRowsPerChunk;
  return (chunks < 1 ? 1 : chunks) * cols;
}

int launch_rmsnorm_backward(const void* dy, const void* x, KernelDType x_type, const void* w, KernelDType w_type,
                            const float* rstd, int64_t rows, int64_t cols, void* dx, float* dw, float* workspace,
                            void* stream) {
  if (!supported(x_type) || !supported(w_type) || rows < 0 || cols <= 0 || !dy || !x || !w || !rstd || !dx || !dw ||
      !workspace)
    return static_cast<int>(cudaErrorInvalidValue);
  const auto s = static_cast<cudaStream_t>(stream);
  const bool bx = x_type == KernelDType::bf16, bw = w_type == KernelDType::bf16;
  if (rows > 0) {
    const int grid = grid_for(rows, kWarpsPerCta);
    if (bx && bw) rmsnorm_dx_kernel<true, true><<<grid, kThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx);
    else if (bx) rmsnorm_dx_kernel<true, false><<<grid, kThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx);
    else if (bw) rmsnorm_dx_kernel<false, true><<<grid, kThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx);
    else rmsnorm_dx_kernel<false, false><<<grid, kThreads, 0, s>>>(dy, x, w, rstd, rows, cols, dx);
  }
  const int64_t chunks = rmsnorm_backward_workspace_floats(rows, cols) / cols;
  if (chunks > 65535) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 partial_grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  if (bx)
    rmsnorm_dw_partial_kernel<true><<<partial_grid, kThreads, 0, s>>>(dy, x, rstd, rows, cols, kRmsnormRowsPerChunk, workspace);
  else
    rmsnorm_dw_partial_kernel<false><<<partial_grid, kThreads, 0, s>>>(dy, x, rstd, rows, cols, kRmsnormRowsPerChunk, workspace);
  sum_chunks_kernel<<<static_cast<unsigned>((cols + kThreads - 1) / kThreads), kThreads, 0, s>>>(workspace, chunks, cols, dw);
  return static_cast<int>(cudaGetLastError());
}

int launch_rope(const void* x, void* out, KernelDType type, int64_t batch, int64_t seq, int64_t heads,
                int64_t head_dim, const float* cos, const float* sin, int64_t table_rows, int backward, void* stream) {
  if (!supported(type) || batch < 0 || seq < 0 || heads < 0 || head_dim <= 0 || head_dim % 2 != 0 || !x || !out ||
      !cos || !sin || (table_rows != seq && table_rows != batch * seq))
    return static_cast<int>(cudaErrorInvalidValue);
  const int64_t pairs = batch * seq * heads * (head_dim / 2);
  if (pairs == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  if (type == KernelDType::bf16)
    rope_kernel<true><<<grid_for(pairs, kThreads), kThreads, 0, s>>>(x, out, batch, seq, heads, head_dim, cos, sin,
                                                                       table_rows, backward);
  else
    rope_kernel<false><<<grid_for(pairs, kThreads), kThreads, 0, s>>>(x, out, batch, seq, heads, head_dim, cos, sin,
                                                                        table_rows, backward);
  return static_cast<int>(cudaGetLastError());
}

int launch_swiglu_forward(const void* gate, const void* up, void* out, KernelDType type, int64_t n, void* stream) {
  if (!supported(type) || n < 0 || !gate || !up || !out) return static_cast<int>(cudaErrorInvalidValue);
  if (n == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  if (type == KernelDType::bf16)
    swiglu_forward_kernel<true><<<grid_for(n, kThreads), kThreads, 0, s>>>(gate, up, out, n);
  else
    swiglu_forward_kernel<false><<<grid_for(n, kThreads), kThreads, 0, s>>>(gate, up, out, n);
  return static_cast<int>(cudaGetLastError());
}

int launch_swiglu_backward(const void* dout, const void* gate, const void* up, void* dgate, void* dup, KernelDType type,
                           int64_t n, void* stream) {
  if (!supported(type) || n < 0 || !dout || !gate || !up || !dgate || !dup) return static_cast<int>(cudaErrorInvalidValue);
  if (n == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  if (type == KernelDType::bf16)
    swiglu_backward_kernel<true><<<grid_for(n, kThreads), kThreads, 0, s>>>(dout, gate, up, dgate, dup, n);
  else
    swiglu_backward_kernel<false><<<grid_for(n, kThreads), kThreads, 0, s>>>(dout, gate, up, dgate, dup, n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace qwen3::kernels
