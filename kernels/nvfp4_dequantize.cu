// NVFP4 dequantize: codes [rows, cols/2] + E4M3 scales [rows, cols/16] -> f32/bf16/f16 [rows, cols], exact.
//
// Each value is e2m1 x e4m3 computed in fp32 (exact: at most 6 significant bits) and then converted, which is
// exact in bf16 and f16 too (|value| in [2^-10, 2688] or 0, at most 6 significant bits).
//
// On the training path: without --grad-checkpoint every trained projection's backward dequantizes its saved
// codes into the product's scratch (the first GPU round: ~250 launches a Qwen3-4B step, ~9 ms of an H200's
// 185). The first form ran a thread a 16-element block (9 bytes read, two 16-byte stores 32 bytes apart a lane):
// one small load in flight a thread. Now the layout of the quantize kernel: a thread a 16-byte output vector
// (8 bf16/f16 or 4 f32 values: 4 or 2 code bytes and the block's scale byte in), kUnroll vectors a thread, all
// their loads issued before the first is decoded, so a warp writes 512 contiguous bytes a store and reads 128
// (or 64) contiguous code bytes a load. Misaligned pointers take a thread-a-block scalar kernel (tests only).
// bf16/f16 values come two at a time from packed multiplies (nvfp4_pairs.cuh, the tensor-core product's decode).
#include <cuda_runtime.h>

#include <climits>

#include "nvfp4_codec.cuh"
#include "nvfp4_device.cuh"
#include "nvfp4_pairs.cuh"
#include "qwen3_kernels.h"

namespace qwen3::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

// The code bytes of one vector as a word (nibble i = element i of the vector).
template <int kCodeBytes>
__device__ __forceinline__ uint32_t load_code_word(const uint8_t* p) {
  if constexpr (kCodeBytes == 4) return __ldcs(reinterpret_cast<const unsigned int*>(p));
  else return __ldcs(reinterpret_cast<const unsigned short*>(p));
}

template <typename Out>
__global__ void __launch_bounds__(kThreads)
    nvfp4_dequantize_vector_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                   int64_t n_vectors, Out* __restrict__ out) {
  constexpr int kPerVector = 16 / sizeof(Out);          // elements a 16-byte store: 4 (f32) or 8
  constexpr int kCodeBytes = kPerVector / 2;            // 2 or 4
  constexpr int kVectorsPerBlock = codec::kBlock / kPerVector;  // vectors sharing a scale: 4 or 2
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;

  uint32_t words[kUnroll];
  uint8_t scale_codes[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t v = first + static_cast<int64_t>(u) * kThreads;
    if (v < n_vectors) {
      words[u] = load_code_word<kCodeBytes>(codes + v * kCodeBytes);
      scale_codes[u] = __ldg(scales + v / kVectorsPerBlock);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t v = first + static_cast<int64_t>(u) * kThreads;
    if (v >= n_vectors) break;
    uint4 packed;
    if constexpr (sizeof(Out) == 2) {
      // Eight values as four packed pairs: shifts, two exact packed multiplies a pair and two byte permutes
      // (nvfp4_pairs.cuh), where the fp32 form decodes, multiplies and converts each value on its own.
      uint32_t pairs_out[4];
      pairs::decode_word<Out>(words[u], pairs::scale_pair<Out>(scale_codes[u]), pairs_out);
      packed = make_uint4(pairs_out[0], pairs_out[1], pairs_out[2], pairs_out[3]);
    } else {
      const float scale = codec::e4m3_to_float(scale_codes[u]);
      alignas(16) Out values[kPerVector];
#pragma unroll
      for (int i = 0; i < kPerVector; ++i)
        values[i] = device::from_float<Out>(codec::e2m1_to_float((words[u] >> (4 * i)) & 0xFu) * scale);
      packed = *reinterpret_cast<const uint4*>(values);
    }
    // A plain store: cuBLAS reads the operand next, and an evict-first store would give up what of it L2 holds.
    *reinterpret_cast<uint4*>(out + v * kPerVector) = packed;
  }
}

// Any alignment: a thread a 16-element block, byte loads and element stores.
template <typename Out>
__global__ void __launch_bounds__(kThreads)
    nvfp4_dequantize_scalar_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                   int64_t n_blocks, Out* __restrict__ out) {
  const int64_t block = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (block >= n_blocks) return;
  const float scale = codec::e4m3_to_float(scales[block]);
  const uint8_t* in = codes + block * (codec::kBlock / 2);
  Out* dst = out + block * codec::kBlock;
  for (int i = 0; i < codec::kBlock; ++i)
    dst[i] = device::from_float<Out>(codec::e2m1_to_float((in[i / 2] >> (4 * (i % 2))) & 0xFu) * scale);
}

template <typename Out>
cudaError_t launch_typed(const uint8_t* codes, const uint8_t* scales, int64_t n_blocks, Out* out,
                         cudaStream_t stream) {
  constexpr int kPerVector = 16 / sizeof(Out);
  if (device::is_aligned(codes, kPerVector / 2) && device::is_aligned(out, 16)) {
    const int64_t n_vectors = n_blocks * (codec::kBlock / kPerVector);
    const int64_t ctas = (n_vectors + kThreads * kUnroll - 1) / (kThreads * kUnroll);
    if (ctas > INT32_MAX) return cudaErrorInvalidValue;
    nvfp4_dequantize_vector_kernel<Out><<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(codes, scales,
                                                                                             n_vectors, out);
  } else {
    nvfp4_dequantize_scalar_kernel<Out>
        <<<static_cast<unsigned>((n_blocks + kThreads - 1) / kThreads), kThreads, 0, stream>>>(codes, scales,
                                                                                              n_blocks, out);
  }
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
