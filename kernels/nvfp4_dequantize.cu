// NVFP4 dequantize: codes [rows, cols/2] + E4M3 scales [rows, cols/16] -> f32/bf16/f16 [rows, cols], exact.
//
// One thread per 16-element block: 8 code bytes and 1 scale byte in, 16 values out. Each value is
// e2m1 x e4m3 computed in fp32 (exact: at most 6 significant bits) and then converted, which is exact in
// bf16 and f16 too (|value| in [2^-10, 2688] or 0, at most 6 significant bits). Used at load time and for
// tests, not in the training step, so it is kept simple; stores are 16-byte vectors when aligned.
#include <cuda_runtime.h>

#include <climits>

#include "nvfp4_codec.cuh"
#include "nvfp4_device.cuh"
#include "qwen3_kernels.h"

namespace qwen3::kernels {
namespace {

constexpr int kThreads = 256;

template <typename Out, bool kVectorized>
__global__ void __launch_bounds__(kThreads)
    nvfp4_dequantize_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                            int64_t n_blocks, Out* __restrict__ out) {
  const int64_t block = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (block >= n_blocks) return;
  const float scale = codec::e4m3_to_float(scales[block]);
  const uint8_t* in = codes + block * (codec::kBlock / 2);
  uint32_t words[2];
  if constexpr (kVectorized) {
    const uint2 raw = *reinterpret_cast<const uint2*>(in);
    words[0] = raw.x;
    words[1] = raw.y;
  } else {
    words[0] = in[0] | (in[1] << 8) | (in[2] << 16) | (uint32_t(in[3]) << 24);
    words[1] = in[4] | (in[5] << 8) | (in[6] << 16) | (uint32_t(in[7]) << 24);
  }
  Out values[codec::kBlock];
#pragma unroll
  for (int i = 0; i < codec::kBlock; ++i) {
    const uint32_t code = (words[i / 8] >> (4 * (i % 8))) & 0xFu;  // element i: nibble i of the block
    values[i] = device::from_float<Out>(codec::e2m1_to_float(code) * scale);
  }
  Out* dst = out + block * codec::kBlock;
  if constexpr (kVectorized) {
    constexpr int kPerStore = 16 / sizeof(Out);
#pragma unroll
    for (int i = 0; i < codec::kBlock; i += kPerStore)
      *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(values + i);
  } else {
#pragma unroll
    for (int i = 0; i < codec::kBlock; ++i) dst[i] = values[i];
  }
}

template <typename Out>
cudaError_t launch_typed(const uint8_t* codes, const uint8_t* scales, int64_t n_blocks, Out* out,
                         cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n_blocks + kThreads - 1) / kThreads));
  if (device::is_aligned(codes, 8) && device::is_aligned(out, 16))
    nvfp4_dequantize_kernel<Out, true><<<grid, kThreads, 0, stream>>>(codes, scales, n_blocks, out);
  else
    nvfp4_dequantize_kernel<Out, false><<<grid, kThreads, 0, stream>>>(codes, scales, n_blocks, out);
  return cudaGetLastError();
}

}  // namespace

int launch_nvfp4_dequantize(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, void* out,
                            KernelDType out_type, void* stream) {
  if (rows < 0 || cols < 0 || cols % codec::kBlock != 0 || !device::valid_dtype(out_type))
    return cudaErrorInvalidValue;
  const int64_t n_blocks = rows * cols / codec::kBlock;
  if (n_blocks == 0) return cudaSuccess;
  if (codes == nullptr || scales == nullptr || out == nullptr) return cudaErrorInvalidValue;
  if ((n_blocks + kThreads - 1) / kThreads > INT32_MAX) return cudaErrorInvalidValue;
  cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  switch (out_type) {
    case KernelDType::f32:
      return launch_typed(codes, scales, n_blocks, static_cast<float*>(out), cuda_stream);
    case KernelDType::bf16:
      return launch_typed(codes, scales, n_blocks, static_cast<__nv_bfloat16*>(out), cuda_stream);
    case KernelDType::f16:
      return launch_typed(codes, scales, n_blocks, static_cast<__half*>(out), cuda_stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace qwen3::kernels
