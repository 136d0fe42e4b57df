// NVFP4-weight matrix product Y[M, N] = X[M, K] · deq(W)ᵀ, W [N, K] as packed E2M1 codes [N, K/2] and E4M3
// scales [N, K/16]; X bf16/f16; fp32 accumulation with mma.sync.m16n8k16 (sm_80+ instruction, built here
// for sm_90/sm_120/sm_121). deq(W) exists only in registers. Design and exactness: kernels/nvfp4_kernels.md.
//
// Tiles: CTA kTileM x 128 (N) x 64 (K), kTileM = 128 (8 warps as 2 x 4, warp tile 64 x 32) or 16 for M <= 16
// (4 warps, warp tile 16 x 32). A multi-stage cp.async pipeline streams X and the packed codes into shared
// memory; scales go through registers (their rows are K/16 bytes, too ragged for cp.async) and are stored
// already converted to a packed pair of the MMA type. When the M x N tiles cannot fill the GPU, K is split
// across a thread-block cluster of up to 8 CTAs whose fp32 partial tiles are summed through distributed
// shared memory in a fixed order (deterministic, no workspace, no atomics).
//
// The k order inside an MMA is free as long as A and B agree. Lane (g = lane/4, t = lane%4) owns, in each
// 32-wide k chunk, the physical elements 8t..8t+7: one 32-bit word of codes (8 nibbles n0..n7) and one
// 16-byte vector of X per row. MMA step 0 takes physical (8t, 8t+4) as logical (2t, 2t+1) and (8t+1, 8t+5)
// as (2t+8, 2t+9); step 1 the same with +2. The B registers then come straight out of the code word by
// shifts and masks, and the A registers are byte permutes of the X vector: no ldmatrix, no lookups, and the
// lane's 8 elements share one scale (they lie in one 16-block).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>

#include "nvfp4_codec.cuh"
#include "nvfp4_device.cuh"
#include "nvfp4_gemv.cuh"
#include "nvfp4_pairs.cuh"
#include "qwen3_kernels.h"

namespace qwen3::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kTileN = 128;
constexpr int kTileK = 64;
constexpr int kChunks = kTileK / 32;          // 32-wide k chunks per tile
constexpr int kScalesPerRow = kTileK / 16;    // E4M3 blocks per W row per tile
constexpr int kMaxSplits = 8;                 // portable cluster size

template <int kTileM>
struct Tiling {
  static constexpr int kWarpsM = kTileM == 128 ? 2 : 1;
  static constexpr int kWarpsN = 4;
  static constexpr int kStages = kTileM == 128 ? 3 : 4;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMmaM = kTileM / kWarpsM / 16;      // m16 tiles per warp
  static constexpr int kMmaN = kTileN / kWarpsN / 8;       // n8 tiles per warp
  static constexpr int kXBytes = kTileM * kTileK * 2;      // [chunk][row][64 bytes]
  static constexpr int kWBytes = kTileN * kTileK / 2;      // [chunk][n][16 bytes]
  static constexpr int kSBytes = kTileN * kScalesPerRow * 4;  // [n][block] packed scale pair
  static constexpr int kStageBytes = kXBytes + kWBytes + kSBytes;
  static constexpr int kPartialStride = kTileN + 4;        // floats per row of a split-K partial tile
  static constexpr int kPartialBytes = kTileM * kPartialStride * 4;
  static constexpr int kSmemBytes =
      kStageBytes * kStages > kPartialBytes ? kStageBytes * kStages : kPartialBytes;
  static constexpr int kXLoads = kTileM * (kTileK / 8) / kThreads;   // 16-byte X pieces per thread
  static constexpr int kWLoads = kTileN * (kTileK / 16) / kThreads;  // 8-byte code pieces per thread
  static constexpr int kSLoads = kTileN * kScalesPerRow / kThreads;  // scale bytes per thread
  static_assert(kXLoads * kThreads == kTileM * (kTileK / 8), "X pieces must divide evenly");
  static_assert(kWLoads * kThreads == kTileN * (kTileK / 16), "code pieces must divide evenly");
  static_assert(kSLoads * kThreads == kTileN * kScalesPerRow, "scales must divide evenly");
};

// The MMA operand type: the packed-pair decode of nvfp4_pairs.cuh (an E2M1 nibble's magnitude bits shifted into
// the low exponent bits and the top mantissa bit, two exact multiplies) and the MMA instruction.
template <typename T>
struct Operand;
template <>
struct Operand<__nv_bfloat16> : pairs::PairFormat<__nv_bfloat16> {
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Operand<__half> : pairs::PairFormat<__half> {
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

using pairs::decode_pair;
using pairs::scale_pair;

__device__ __forceinline__ void cp_async16(void* smem, const void* global, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(global), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async8(void* smem, const void* global, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(global), "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
}

template <typename Out>
__device__ __forceinline__ void store_pair(Out* y, int M, int N, int m, int n, float v0, float v1,
                                           bool paired_stores) {
  if (m >= M) return;
  Out* row = y + static_cast<int64_t>(m) * N;
  if (paired_stores && n + 1 < N) {  // n is even; N even and y aligned to two elements
    if constexpr (sizeof(Out) == 4) {
      *reinterpret_cast<float2*>(row + n) = make_float2(v0, v1);
    } else {
      const Out pair[2] = {device::from_float<Out>(v0), device::from_float<Out>(v1)};
      *reinterpret_cast<uint32_t*>(row + n) = *reinterpret_cast<const uint32_t*>(pair);
    }
    return;
  }
  if (n < N) row[n] = device::from_float<Out>(v0);
  if (n + 1 < N) row[n + 1] = device::from_float<Out>(v1);
}

template <typename In, typename Out, int kTileM>
__global__ void __launch_bounds__(Tiling<kTileM>::kThreads)
    nvfp4_matmul_kernel(const In* __restrict__ x, const uint8_t* __restrict__ codes,
                        const uint8_t* __restrict__ scales, Out* __restrict__ y, int M, int N, int K, int splits,
                        bool paired_stores) {
  using T = Tiling<kTileM>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / T::kWarpsN, warp_n = warp % T::kWarpsN;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.z * kTileM, n0 = blockIdx.x * kTileN;
  const int k_tiles = (K + kTileK - 1) / kTileK;
  const int tile_begin = static_cast<int>(static_cast<int64_t>(blockIdx.y) * k_tiles / splits);
  const int tile_count = static_cast<int>(static_cast<int64_t>(blockIdx.y + 1) * k_tiles / splits) - tile_begin;
  const int64_t code_row_bytes = K / 2, scale_row_bytes = K / 16;

  auto load_tile_async = [&](int stage, int tile) {
    uint8_t* x_smem = smem + stage * T::kStageBytes;
    uint8_t* w_smem = x_smem + T::kXBytes;
    const int k0 = tile * kTileK;
#pragma unroll
    for (int i = 0; i < T::kXLoads; ++i) {
      const int piece = tid + i * T::kThreads, row = piece >> 3, part = piece & 7;  // 8 x 16 bytes a row
      const int m = m0 + row, k = k0 + part * 8;
      const bool valid = m < M && k < K;  // K % 16 == 0: a piece is wholly inside or outside
      const In* src = valid ? x + static_cast<int64_t>(m) * K + k : x;
      cp_async16(x_smem + (part >> 2) * (kTileM * 64) + row * 64 + (part & 3) * 16, src, valid);
    }
#pragma unroll
    for (int i = 0; i < T::kWLoads; ++i) {
      const int piece = tid + i * T::kThreads, row = piece >> 2, part = piece & 3;  // 4 x 8 bytes a row
      const int n = n0 + row, k = k0 + part * 16;
      const bool valid = n < N && k < K;
      const uint8_t* src = valid ? codes + static_cast<int64_t>(n) * code_row_bytes + k / 2 : codes;
      cp_async8(w_smem + (part >> 1) * (kTileN * 16) + row * 16 + (part & 1) * 8, src, valid);
    }
  };
  auto load_scales = [&](int tile, uint32_t (&pairs)[T::kSLoads]) {
#pragma unroll
    for (int i = 0; i < T::kSLoads; ++i) {
      const int entry = tid + i * T::kThreads, row = entry / kScalesPerRow;
      const int n = n0 + row, block = tile * kScalesPerRow + entry % kScalesPerRow;
      const uint8_t code =
          (n < N && block < scale_row_bytes) ? __ldg(scales + static_cast<int64_t>(n) * scale_row_bytes + block) : 0;
      pairs[i] = scale_pair<In>(code);  // code 0 = scale 0: padding decodes to zeros
    }
  };
  auto store_scales = [&](int stage, const uint32_t (&pairs)[T::kSLoads]) {
    uint32_t* s_smem = reinterpret_cast<uint32_t*>(smem + stage * T::kStageBytes + T::kXBytes + T::kWBytes);
#pragma unroll
    for (int i = 0; i < T::kSLoads; ++i) s_smem[tid + i * T::kThreads] = pairs[i];
  };

  float acc[T::kMmaM][T::kMmaN][4];
#pragma unroll
  for (int a = 0; a < T::kMmaM; ++a)
#pragma unroll
    for (int b = 0; b < T::kMmaN; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;

  auto compute = [&](int stage) {
    const uint8_t* x_smem = smem + stage * T::kStageBytes;
    const uint8_t* w_smem = x_smem + T::kXBytes;
    const uint32_t* s_smem = reinterpret_cast<const uint32_t*>(w_smem + T::kWBytes);
#pragma unroll
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      uint4 x_rows[T::kMmaM][2];  // rows g and g + 8 of each m16 tile: X[row][8t .. 8t+7] of this chunk
#pragma unroll
      for (int mt = 0; mt < T::kMmaM; ++mt) {
        const int row = warp_m * (T::kMmaM * 16) + mt * 16 + g;
        const uint8_t* base = x_smem + chunk * (kTileM * 64) + t * 16;
        x_rows[mt][0] = *reinterpret_cast<const uint4*>(base + row * 64);
        x_rows[mt][1] = *reinterpret_cast<const uint4*>(base + (row + 8) * 64);
      }
      uint32_t words[T::kMmaN], pairs[T::kMmaN];
#pragma unroll
      for (int nt = 0; nt < T::kMmaN; ++nt) {
        const int n = warp_n * (T::kMmaN * 8) + nt * 8 + g;
        words[nt] = *reinterpret_cast<const uint32_t*>(w_smem + chunk * (kTileN * 16) + n * 16 + t * 4);
        pairs[nt] = s_smem[n * kScalesPerRow + chunk * 2 + (t >> 1)];
      }
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        uint32_t b[T::kMmaN][2];
#pragma unroll
        for (int nt = 0; nt < T::kMmaN; ++nt) {
          b[nt][0] = decode_pair<In>(words[nt] << (12 - 8 * step), pairs[nt]);  // nibbles (2s, 2s+4)
          b[nt][1] = decode_pair<In>(words[nt] << (8 - 8 * step), pairs[nt]);   // nibbles (2s+1, 2s+5)
        }
#pragma unroll
        for (int mt = 0; mt < T::kMmaM; ++mt) {
          const uint32_t lo0 = step == 0 ? x_rows[mt][0].x : x_rows[mt][0].y;  // X[8t+2s], X[8t+2s+1]
          const uint32_t hi0 = step == 0 ? x_rows[mt][0].z : x_rows[mt][0].w;  // X[8t+2s+4], X[8t+2s+5]
          const uint32_t lo1 = step == 0 ? x_rows[mt][1].x : x_rows[mt][1].y;
          const uint32_t hi1 = step == 0 ? x_rows[mt][1].z : x_rows[mt][1].w;
          const uint32_t a[4] = {__byte_perm(lo0, hi0, 0x5410), __byte_perm(lo1, hi1, 0x5410),
                                 __byte_perm(lo0, hi0, 0x7632), __byte_perm(lo1, hi1, 0x7632)};
#pragma unroll
          for (int nt = 0; nt < T::kMmaN; ++nt) Operand<In>::mma(acc[mt][nt], a, b[nt][0], b[nt][1]);
        }
      }
    }
  };

  // Pipeline: kStages - 1 tiles in flight while one is computed. Exactly one commit group per tile slot
  // (empty past the end) keeps cp.async.wait_group's count uniform.
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < tile_count) {
      load_tile_async(s, tile_begin + s);
      uint32_t pairs[T::kSLoads];
      load_scales(tile_begin + s, pairs);
      store_scales(s, pairs);
    }
    cp_async_commit();
  }
  for (int i = 0; i < tile_count; ++i) {
    cp_async_wait<T::kStages - 2>();
    __syncthreads();  // tile i is visible to all; every warp is done with tile i - 1, whose slot is reused now
    const int next = i + T::kStages - 1;
    const bool prefetch = next < tile_count;
    uint32_t pairs[T::kSLoads];
    if (prefetch) {
      load_tile_async(next % T::kStages, tile_begin + next);
      load_scales(tile_begin + next, pairs);
    }
    cp_async_commit();
    compute(i % T::kStages);
    if (prefetch) store_scales(next % T::kStages, pairs);  // their latency hid behind compute
  }

  if (splits == 1) {
#pragma unroll
    for (int mt = 0; mt < T::kMmaM; ++mt)
#pragma unroll
      for (int nt = 0; nt < T::kMmaN; ++nt) {
        const int m = m0 + warp_m * (T::kMmaM * 16) + mt * 16 + g;
        const int n = n0 + warp_n * (T::kMmaN * 8) + nt * 8 + 2 * t;
        store_pair(y, M, N, m, n, acc[mt][nt][0], acc[mt][nt][1], paired_stores);
        store_pair(y, M, N, m + 8, n, acc[mt][nt][2], acc[mt][nt][3], paired_stores);
      }
    return;
  }

  // Split-K: every CTA of the cluster parks its fp32 partial tile in its own shared memory; rank r then sums
  // rows [r * kTileM / splits, ...) over all ranks in rank order and writes them.
  cp_async_wait<0>();
  __syncthreads();
  float* partial = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int mt = 0; mt < T::kMmaM; ++mt)
#pragma unroll
    for (int nt = 0; nt < T::kMmaN; ++nt) {
      const int m = warp_m * (T::kMmaM * 16) + mt * 16 + g;
      const int n = warp_n * (T::kMmaN * 8) + nt * 8 + 2 * t;
      *reinterpret_cast<float2*>(partial + m * T::kPartialStride + n) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
      *reinterpret_cast<float2*>(partial + (m + 8) * T::kPartialStride + n) =
          make_float2(acc[mt][nt][2], acc[mt][nt][3]);
    }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rows_per_rank = kTileM / splits;
  const int first_row = static_cast<int>(cluster.block_rank()) * rows_per_rank;
  for (int e = tid; e < rows_per_rank * (kTileN / 2); e += T::kThreads) {
    const int r = first_row + e / (kTileN / 2), c = (e % (kTileN / 2)) * 2;
    float v0 = 0.0f, v1 = 0.0f;
    for (int rank = 0; rank < splits; ++rank) {
      const float* remote = cluster.map_shared_rank(partial, rank);
      const float2 part = *reinterpret_cast<const float2*>(remote + r * T::kPartialStride + c);
      v0 += part.x;
      v1 += part.y;
    }
    store_pair(y, M, N, m0 + r, n0 + c, v0, v1, paired_stores);
  }
  cluster.sync();  // no CTA may exit while another still reads its shared memory
}

template <typename In, typename Out, int kTileM>
cudaError_t launch_tiled(const In* x, const uint8_t* codes, const uint8_t* scales, Out* y, int M, int N, int K,
                         cudaStream_t stream) {
  using T = Tiling<kTileM>;
  auto kernel = nvfp4_matmul_kernel<In, Out, kTileM>;
  if (T::kSmemBytes > 48 * 1024) {
    const cudaError_t status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
    if (status != cudaSuccess) return status;
  }
  int device = 0, sm_count = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  if (status != cudaSuccess) return status;

  const int64_t tiles_n = (N + kTileN - 1) / kTileN, tiles_m = (M + kTileM - 1) / kTileM;
  const int64_t k_tiles = (K + kTileK - 1) / kTileK;
  if (tiles_m > 65535 || tiles_n > INT32_MAX) return cudaErrorInvalidValue;
  // Split K until the tiles fill every SM twice, keeping at least two k tiles per split.
  int splits = 1;
  while (splits < kMaxSplits && tiles_n * tiles_m * splits < 2 * sm_count && k_tiles >= 4 * splits) splits *= 2;

  const bool paired_stores = N % 2 == 0 && device::is_aligned(y, 2 * sizeof(Out));
  const dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(splits), static_cast<unsigned>(tiles_m));
  if (splits == 1) {
    kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(x, codes, scales, y, M, N, K, 1, paired_stores);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(T::kThreads);
  config.dynamicSmemBytes = T::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = 1;
  attribute[0].val.clusterDim.y = static_cast<unsigned>(splits);
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  status = cudaLaunchKernelEx(&config, kernel, x, codes, scales, y, M, N, K, splits, paired_stores);
  return status != cudaSuccess ? status : cudaGetLastError();
}

template <typename In, typename Out>
cudaError_t launch_for_m(const In* x, const uint8_t* codes, const uint8_t* scales, Out* y, int M, int N, int K,
                         cudaStream_t stream) {
  if (M <= 16) return launch_tiled<In, Out, 16>(x, codes, scales, y, M, N, K, stream);
  return launch_tiled<In, Out, 128>(x, codes, scales, y, M, N, K, stream);
}

template <typename In>
cudaError_t launch_for_output(const In* x, const uint8_t* codes, const uint8_t* scales, void* y,
                              KernelDType y_type, int M, int N, int K, cudaStream_t stream) {
  switch (y_type) {
    case KernelDType::f32: return launch_for_m(x, codes, scales, static_cast<float*>(y), M, N, K, stream);
    case KernelDType::bf16:
      return launch_for_m(x, codes, scales, static_cast<__nv_bfloat16*>(y), M, N, K, stream);
    case KernelDType::f16: return launch_for_m(x, codes, scales, static_cast<__half*>(y), M, N, K, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

int launch_nvfp4_matmul(const void* x, KernelDType x_type, int64_t M, int64_t K, const uint8_t* codes,
                        const uint8_t* scales, int64_t N, void* y, KernelDType y_type, void* stream) {
  if (M < 0 || N < 0 || K < 0 || K % 16 != 0 || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX ||
      (x_type != KernelDType::bf16 && x_type != KernelDType::f16) || !device::valid_dtype(y_type))
    return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  if (y == nullptr || (K > 0 && (x == nullptr || codes == nullptr || scales == nullptr)))
    return cudaErrorInvalidValue;
  if (!device::is_aligned(x, 16) || !device::is_aligned(codes, 8)) return cudaErrorInvalidValue;
  // A few rows (generation): the tensor-core tile would be mostly empty; the GEMV streams the codes instead.
  if (gemv::takes(M, K) && device::is_aligned(codes, 16))
    return launch_nvfp4_gemv(x, x_type, M, K, codes, scales, N, y, y_type, stream);
  cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  if (x_type == KernelDType::bf16)
    return launch_for_output(static_cast<const __nv_bfloat16*>(x), codes, scales, y, y_type, m, n, k, cuda_stream);
  return launch_for_output(static_cast<const __half*>(x), codes, scales, y, y_type, m, n, k, cuda_stream);
}

}  // namespace qwen3::kernels
