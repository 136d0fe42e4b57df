// NVFP4-weight product for a few rows of x (M <= 4: generation's one token a step, small batches):
// y[M, N] = x[M, K] · deq(W)ᵀ with fp32 FMAs, a warp per two rows of W. The tensor-core kernel (nvfp4_matmul.cu)
// tiles 16 rows of x however few there are and streamed the codes at 13% of an H200's bandwidth at M = 1 (the
// first GPU round: 22.6 µs for 9728 x 2560, where cuBLAS's bf16 product of the dequantized weight took 16.3);
// here nothing but the codes and scales comes from memory (x is a few KB, read through L1), each code byte is
// read once, and a warp's code loads are 512 contiguous bytes. The arithmetic and the work split are
// nvfp4_gemv.cuh's (run on the host by tests/test_nvfp4_gemv_lanes.cpp); this file adds loads, the shuffles of
// the final sum and the stores. launch_nvfp4_matmul sends the products gemv::takes() accepts here.
#include <cuda_runtime.h>

#include <climits>

#include "nvfp4_device.cuh"
#include "nvfp4_gemv.cuh"
#include "qwen3_kernels.h"

namespace qwen3::kernels {
namespace {

constexpr int kWarpsPerCta = 4;  // 128 threads: a 1024-row W (the k/v projections) still gives 128 CTAs
constexpr int kThreads = 32 * kWarpsPerCta;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

template <typename In, typename Out, int kM>
__global__ void __launch_bounds__(kThreads)
    nvfp4_gemv_kernel(const In* __restrict__ x, const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                      Out* __restrict__ y, int N, int K) {
  constexpr int kOut = gemv::kOutputsPerWarp;
  const int lane = threadIdx.x % 32;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32) * kOut;
  if (n0 >= N) return;  // the whole warp
  const int64_t chunks = K / gemv::kChunk;

  float acc[kM][kOut] = {};
  for (int64_t c = lane; c < chunks; c += gemv::kLanes) {
    // This chunk's code words (nibble i of word p = element 8p + i of the chunk) and scales, each W row; a row
    // past N reads nothing and contributes zeros that are never stored.
    uint32_t words[kOut][4];
    uint8_t scale_codes[kOut][2];
#pragma unroll
    for (int r = 0; r < kOut; ++r) {
      if (n0 + r < N) {
        const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(codes + gemv::code_word_offset(n0 + r, K, c, 0)));
        words[r][0] = raw.x, words[r][1] = raw.y, words[r][2] = raw.z, words[r][3] = raw.w;
        scale_codes[r][0] = __ldg(scales + gemv::scale_offset(n0 + r, K, c, 0));
        scale_codes[r][1] = __ldg(scales + gemv::scale_offset(n0 + r, K, c, 1));
      } else {
        words[r][0] = words[r][1] = words[r][2] = words[r][3] = 0;
        scale_codes[r][0] = scale_codes[r][1] = 0;
      }
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      float block_sum[kM][kOut] = {};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int p = 2 * b + j;
        float xs[kM][gemv::kPiece];
#pragma unroll
        for (int m = 0; m < kM; ++m)
          device::load16_as_float_cached(x + static_cast<int64_t>(m) * K + gemv::piece_first_k(c, p), xs[m]);
        uint32_t word[kOut];
#pragma unroll
        for (int r = 0; r < kOut; ++r) word[r] = words[r][p];
        gemv::accumulate_piece<kM>(xs, word, block_sum);
      }
      uint8_t block_scales[kOut];
#pragma unroll
      for (int r = 0; r < kOut; ++r) block_scales[r] = scale_codes[r][b];
      gemv::finish_block<kM>(block_sum, block_scales, acc);
    }
  }
  // The lanes' sums, the same butterfly the host run does.
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int r = 0; r < kOut; ++r)
#pragma unroll
      for (int d = gemv::kLanes / 2; d >= 1; d /= 2) acc[m][r] = __fadd_rn(acc[m][r], __shfl_xor_sync(kFullMask, acc[m][r], d));
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kOut; ++r)
    if (n0 + r < N)
#pragma unroll
      for (int m = 0; m < kM; ++m) y[static_cast<int64_t>(m) * N + n0 + r] = device::from_float<Out>(acc[m][r]);
}

template <typename In, typename Out>
cudaError_t launch_typed(const In* x, int M, int K, const uint8_t* codes, const uint8_t* scales, int N, Out* y,
                         cudaStream_t stream) {
  const int64_t warps = (static_cast<int64_t>(N) + gemv::kOutputsPerWarp - 1) / gemv::kOutputsPerWarp;
  const auto grid = static_cast<unsigned>((warps + kWarpsPerCta - 1) / kWarpsPerCta);
  switch (M) {
    case 1: nvfp4_gemv_kernel<In, Out, 1><<<grid, kThreads, 0, stream>>>(x, codes, scales, y, N, K); break;
    case 2: nvfp4_gemv_kernel<In, Out, 2><<<grid, kThreads, 0, stream>>>(x, codes, scales, y, N, K); break;
    case 3: nvfp4_gemv_kernel<In, Out, 3><<<grid, kThreads, 0, stream>>>(x, codes, scales, y, N, K); break;
    default: nvfp4_gemv_kernel<In, Out, 4><<<grid, kThreads, 0, stream>>>(x, codes, scales, y, N, K); break;
  }
  return cudaGetLastError();
}

template <typename In>
cudaError_t launch_for_output(const In* x, int M, int K, const uint8_t* codes, const uint8_t* scales, int N, void* y,
                              KernelDType y_type, cudaStream_t stream) {
  switch (y_type) {
    case KernelDType::f32: return launch_typed(x, M, K, codes, scales, N, static_cast<float*>(y), stream);
    case KernelDType::bf16: return launch_typed(x, M, K, codes, scales, N, static_cast<__nv_bfloat16*>(y), stream);
    case KernelDType::f16: return launch_typed(x, M, K, codes, scales, N, static_cast<__half*>(y), stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

int launch_nvfp4_gemv(const void* x, KernelDType x_type, int64_t M, int64_t K, const uint8_t* codes,
                      const uint8_t* scales, int64_t N, void* y, KernelDType y_type, void* stream) {
  if (!gemv::takes(M, K) || N < 0 || N > INT32_MAX || K > INT32_MAX ||
      (x_type != KernelDType::bf16 && x_type != KernelDType::f16) || !device::valid_dtype(y_type))
    return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  if (x == nullptr || codes == nullptr || scales == nullptr || y == nullptr) return cudaErrorInvalidValue;
  if (!device::is_aligned(x, 16) || !device::is_aligned(codes, 16)) return cudaErrorInvalidValue;
  cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  if (x_type == KernelDType::bf16)
    return launch_for_output(static_cast<const __nv_bfloat16*>(x), m, k, codes, scales, n, y, y_type, cuda_stream);
  return launch_for_output(static_cast<const __half*>(x), m, k, codes, scales, n, y, y_type, cuda_stream);
}

}  // namespace qwen3::kernels
