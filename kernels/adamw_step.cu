// The fused AdamW step on the GPU: one launch per parameter, the element rules of adamw_update.cuh (the same
// functions the CPU step runs, pinned by its tests). Layout of work and its costs: kernels/adamw_step.md.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "adamw_int8_lanes.cuh"
#include "adamw_nvfp4_lanes.cuh"
#include "adamw_plain_lanes.cuh"
#include "adamw_update.cuh"
#include "nvfp4_block_lanes.cuh"
#include "qwen3_kernels.h"

namespace qwen3::kernels {
namespace {

using adamw::Moments;
using adamw::ParamView;
using adamw::StepScalars;

constexpr int kThreads = 256;

// fp32 / bf16 moments: four elements a thread (a warp's loads contiguous: element k of a thread is kThreads
// after its element k - 1), grid-stride; every byte read and written once. All four elements' loads are issued
// before the first store: as far as the compiler knows a store may alias a later load, so loads left after a
// store wait a memory round trip each (one element a thread with its master loaded after the moments' stores
// ran at ~88 µs for 10.5 M parameters whatever the bytes: kernels/adamw_step.md).
constexpr int kPlainPerThread = 4;

template <bool kBf16Moments>
__global__ void __launch_bounds__(kThreads) plain_kernel(ParamView p, StepScalars s) {
  if (!adamw::take_device_grad_scale(s)) return;
  using State = typename std::conditional<kBf16Moments, uint16_t, float>::type;
  auto* exp_avg = static_cast<State*>(p.exp_avg);
  auto* exp_avg_sq = static_cast<State*>(p.exp_avg_sq);
  const int64_t total = p.rows * p.cols;
  constexpr int64_t kTile = static_cast<int64_t>(kThreads) * kPlainPerThread;
  for (int64_t tile = blockIdx.x * kTile; tile < total; tile += static_cast<int64_t>(gridDim.x) * kTile) {
    float g[kPlainPerThread], m[kPlainPerThread], v[kPlainPerThread], master[kPlainPerThread];
#pragma unroll
    for (int k = 0; k < kPlainPerThread; ++k) {
      const int64_t i = tile + k * kThreads + threadIdx.x;
      if (i >= total) continue;
      if (kBf16Moments) {
        m[k] = adamw::bf16_to_float(exp_avg[i]);
        v[k] = adamw::bf16_to_float(exp_avg_sq[i]);
      } else {
        m[k] = exp_avg[i];
        v[k] = exp_avg_sq[i];
      }
      // Unpadded storage: the element index is the gradient's.
      g[k] = p.grad_bf16 ? adamw::grad_at<true>(p.grad, i, s.grad_scale) : adamw::grad_at<false>(p.grad, i, s.grad_scale);
      master[k] = adamw::master_of(p, i);
    }
#pragma unroll
    for (int k = 0; k < kPlainPerThread; ++k) {
      const int64_t i = tile + k * kThreads + threadIdx.x;
      if (i >= total) continue;
      adamw::update_moments(g[k], m[k], v[k], s);
      if constexpr (kBf16Moments) {
        const adamw::ElementDraws draws = adamw::element_draws(s.random_key, static_cast<uint64_t>(i));
        exp_avg[i] = adamw::bf16_stochastic(m[k], adamw::sixteen_bits_of_draw(draws.m));
        exp_avg_sq[i] = adamw::bf16_stochastic(v[k], adamw::sixteen_bits_of_draw(draws.v));
        master[k] = adamw::step_master(p, s, i, master[k], m[k], v[k], draws.master);
      } else {
        exp_avg[i] = m[k];
        exp_avg_sq[i] = v[k];
        master[k] = adamw::step_master_drawing(p, s, i, master[k], m[k], v[k], static_cast<uint64_t>(i));
      }
    }
  }
}

// --keep-weight-operands always with plain moments: the update and the stepped masters' bf16 operand
// deq(Q(master)) for the next forward, four consecutive elements a lane (adamw_plain_lanes.cuh: a 16-block is
// four lanes, whose two exchanges give its scale; each lane makes the scale once for its four elements, where
// plain_kernel's split, an element a lane, had each element make it), whole pieces where the buffers allow. A
// kernel of its own, so that the update without it keeps plain_kernel's registers and CTAs (kernels/adamw_step.md).
// Tiles and warps start at multiples of 128 elements, and the tensor ends on a 16-block boundary (cols, a multiple
// of 16): every lane takes part in the exchanges, a lane past the end with zeros and no store.
template <bool kBf16Moments>
__global__ void __launch_bounds__(kThreads) plain_operand_kernel(ParamView p, StepScalars s) {
  namespace lanes = adamw::plain_lanes;
  if (!adamw::take_device_grad_scale(s)) return;
  const int64_t total = p.rows * p.cols;
  const bool pieces = lanes::moves_whole_pieces(p);
  constexpr int64_t kTile = static_cast<int64_t>(kThreads) * lanes::kPerLane;
  for (int64_t tile = blockIdx.x * kTile; tile < total; tile += static_cast<int64_t>(gridDim.x) * kTile) {
    const int64_t first = tile + static_cast<int64_t>(threadIdx.x) * lanes::kPerLane;
    const bool here = first < total;
    lanes::SteppedMasters stepped{};
    if (here) {
      const lanes::LaneState state = lanes::fresh<kBf16Moments>(p, s, first, total, pieces);
      stepped = lanes::store<kBf16Moments>(p, s, first, total, state, pieces);
    }
    lanes::write_operand(p, first, static_cast<int>(threadIdx.x), here, stepped, pieces, block_lanes::ShuffleXor{});
  }
}

// int8: 8 lanes a 64-block, 8 consecutive elements a lane (the split is adamw_int8_lanes.cuh, __host__
// __device__, run on the host by tests/test_adamw_int8_lanes.cpp); the block's |m| maximum and v maximum meet by
// shuffles (maxima are exact in any order). Every byte read and written once, a lane's eight elements as whole
// pieces where the row and the buffers allow (moves_whole_pieces). An instantiation for each master and gradient
// dtype: the kernel is bound by its instructions, and with the dtypes known at run time every element computed
// both forms of the gradient's scaling and of the master's store and chose one. At most 64 registers: four CTAs
// of 256 an SM, as before the instantiations (the fp32-master ones took 66 unbounded, so three; no spills at 64).
// kOperand (--keep-weight-operands always): the stepped masters' bf16 operand too, each 16-block's scale from the
// lane pair that holds it (adamw_int8_lanes.cuh, write_operand), in instantiations of its own.
template <bool kMasterBf16, bool kGradBf16, bool kOperand>
__global__ void __launch_bounds__(kThreads, 4) int8_kernel(ParamView p, StepScalars s) {
  namespace lanes = adamw::int8_lanes;
  if (!adamw::take_device_grad_scale(s)) return;  // the same value for every thread: the whole grid returns
  p.master_bf16 = kMasterBf16 ? 1 : 0;  // the launcher picked the instantiation by them
  p.grad_bf16 = kGradBf16 ? 1 : 0;
  // v's 256 log levels, and under each the next level with the reciprocal of the gap (the rules' own values,
  // computed once a CTA): shared-memory loads instead of pick8's eight compares, masks and ors, once an element
  // to decode and twice to encode (the level at the estimated code, then the pair under the code).
  __shared__ float levels[256];
  __shared__ adamw::LowerAndInverseGap below[256];
  for (int c = threadIdx.x; c < 256; c += blockDim.x) {
    levels[c] = adamw::int8_log_level(static_cast<uint32_t>(c));
    below[c] = adamw::ComputedLevels{}.below(static_cast<uint32_t>(c));
  }
  __syncthreads();
  const adamw::TabledLevels level{levels, below};
  const int64_t total_blocks = p.rows * (p.stored_cols / adamw::kInt8Block);
  const int lane = threadIdx.x % lanes::kLanesPerBlock;
  // Whole warps iterate together so that every lane takes part in the shuffles.
  const int64_t groups_per_pass = static_cast<int64_t>(gridDim.x) * (blockDim.x / lanes::kLanesPerBlock);
  const bool narrow = total_blocks + groups_per_pass <= static_cast<int64_t>(UINT32_MAX);
  const bool pieces = lanes::moves_whole_pieces(p);
  for (int64_t first = 0; first < total_blocks; first += groups_per_pass) {
    const int64_t block =
        first + blockIdx.x * static_cast<int64_t>(blockDim.x / lanes::kLanesPerBlock) + threadIdx.x / lanes::kLanesPerBlock;
    const bool active = block < total_blocks;
    lanes::LanePosition at{};
    lanes::LaneState state{};
    if (active) {
      at = lanes::position(p, block, lane, narrow);
      state = lanes::fresh(p, s, block, at, level, pieces);
    }
    float m_amax = state.m_amax, v_max = state.v_max;
    for (int offset = 1; offset < lanes::kLanesPerBlock; offset *= 2) {
      m_amax = fmaxf(m_amax, __shfl_xor_sync(0xFFFFFFFFu, m_amax, offset));
      v_max = fmaxf(v_max, __shfl_xor_sync(0xFFFFFFFFu, v_max, offset));
    }
    lanes::SteppedMasters stepped{};
    if (active) stepped = lanes::store(p, s, block, at, lane, state, m_amax, v_max, level, pieces);
    if constexpr (kOperand)
      lanes::write_operand(p, at, lane, active && at.col0 < p.cols, stepped, pieces, block_lanes::ShuffleXor{});
  }
}

__device__ float block_max(float x, float* shared) {
  __syncthreads();  // whoever still reads `shared` from the previous reduction is done
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, offset));
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = x;
  __syncthreads();
  x = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : 0.0f;
  if (threadIdx.x < 32)
    for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, offset));
  if (threadIdx.x == 0) shared[0] = x;
  __syncthreads();
  return shared[0];
}

// nvfp4: one CTA a row, four lanes a 16-block (adamw_nvfp4_lanes.cuh). The row's fp32 scales need the row's
// largest |m| and sqrt(v) before any element is encoded: a first pass computes the fresh moments for the maxima
// only, the second recomputes them (the same bytes) and encodes. The gradient and the packed state are read
// twice (the second time mostly from L2: a row is at most a few tens of KB).
constexpr int kNvfp4Threads = 128;
constexpr int kNvfp4Groups = kNvfp4Threads / adamw::nvfp4_lanes::kLanesPerBlock;

// An instantiation for each master and gradient dtype, as int8_kernel has; kOperand as there (each 16-block's
// operand scale from the four lanes that hold it).
template <bool kMasterBf16, bool kGradBf16, bool kOperand>
__global__ void __launch_bounds__(kNvfp4Threads) nvfp4_kernel(ParamView p, StepScalars s) {
  namespace lanes = adamw::nvfp4_lanes;
  if (!adamw::take_device_grad_scale(s)) return;  // uniform: no thread is left at a barrier or a shuffle
  p.master_bf16 = kMasterBf16 ? 1 : 0;  // the launcher picked the instantiation by them
  p.grad_bf16 = kGradBf16 ? 1 : 0;
  __shared__ float shared[kNvfp4Threads / 32];
  // sqrt(v)'s eight inverse square gaps (the rule's values): a shared-memory load where pick8 takes eight
  // compares, masks and ors.
  __shared__ float square_gaps[8];
  if (threadIdx.x < 8) square_gaps[threadIdx.x] = adamw::nvfp4_inverse_square_gap(threadIdx.x);
  __syncthreads();
  const int64_t blocks = p.stored_cols / adamw::kNvfp4Block;
  const int lane = threadIdx.x % lanes::kLanesPerBlock;
  const int group = threadIdx.x / lanes::kLanesPerBlock;
  const bool pieces = lanes::moves_whole_pieces(p);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const float old_m_row = p.exp_avg_row_scale[row], old_v_row = p.exp_avg_sq_row_scale[row];
    float m_max = 0.0f, v_max = 0.0f;
    for (int64_t b = group; b < blocks; b += kNvfp4Groups)
      lanes::row_maxima(lanes::fresh(p, s, row, b, lane, old_m_row, old_v_row, pieces), m_max, v_max);
    m_max = block_max(m_max, shared);
    const float root_max = sqrtf(block_max(v_max, shared));
    const float m_row = adamw::nvfp4_row_scale(m_max), v_row = adamw::nvfp4_row_scale(root_max);
    const adamw::BlockDivisor m_row_divisor = adamw::block_divisor(m_row), v_row_divisor = adamw::block_divisor(v_row);
    // Whole warps iterate together (the trip count depends on the row length only) so that every lane takes
    // part in the shuffles.
    for (int64_t first = 0; first < blocks; first += kNvfp4Groups) {
      const int64_t b = first + group;
      const bool active = b < blocks;
      lanes::LaneMoments moments{};
      lanes::LaneMasters masters{};
      lanes::LaneNormalized normalized{};
      if (active) {
        moments = lanes::fresh(p, s, row, b, lane, old_m_row, old_v_row, pieces);
        masters = lanes::load_masters(p, row, b, lane, pieces);
        normalized = lanes::normalize(moments, m_row_divisor, v_row_divisor);
      }
      float m_amax = normalized.m_amax, root_amax = normalized.root_amax;
      for (int offset = 1; offset < lanes::kLanesPerBlock; offset *= 2) {
        m_amax = fmaxf(m_amax, __shfl_xor_sync(0xFFFFFFFFu, m_amax, offset));
        root_amax = fmaxf(root_amax, __shfl_xor_sync(0xFFFFFFFFu, root_amax, offset));
      }
      lanes::SteppedMasters stepped{};
      if (active)
        stepped = lanes::store(p, s, row, b, lane, moments, masters, normalized,
                               adamw::nvfp4_unclipped_scale_code(m_amax), adamw::nvfp4_unclipped_scale_code(root_amax),
                               adamw::TabledSquareGaps{square_gaps}, pieces);
      if constexpr (kOperand) lanes::write_operand(p, row, b, lane, active, stepped, pieces, block_lanes::ShuffleXor{});
    }
    if (threadIdx.x == 0) {  // every thread read the old row scales before block_max's barriers
      p.exp_avg_row_scale[row] = m_row;
      p.exp_avg_sq_row_scale[row] = v_row;
    }
    __syncthreads();  // the next row reuses `shared`
  }
}

// Calls launch(master bf16, gradient bf16) with both as compile-time constants (std::integral_constant), for the
// kernels instantiated per dtype.
template <typename Launch>
void with_dtypes(const ParamView& p, Launch launch) {
  using T = std::true_type;
  using F = std::false_type;
  if (p.master_bf16 && p.grad_bf16) launch(T{}, T{});
  else if (p.master_bf16) launch(T{}, F{});
  else if (p.grad_bf16) launch(F{}, T{});
  else launch(F{}, F{});
}

int grid_for(int64_t work_items, int items_per_cta, int max_ctas) {
  const int64_t ctas = (work_items + items_per_cta - 1) / items_per_cta;
  // Grid-stride beyond ~64 K CTAs (enough to fill any GPU, and int-sized) or the caller's cap.
  const int64_t cap = max_ctas > 0 && max_ctas < 65536 ? max_ctas : 65536;
  return static_cast<int>(ctas < 1 ? 1 : (ctas > cap ? cap : ctas));
}

// How many CTAs of the int8 kernel the current device holds at once (its SMs times the CTAs an SM fits), asked
// once a device. Each CTA builds v's two 256-entry tables and reads the step's scalars before its first element;
// with a CTA per 32 blocks (the grid before) every thread did that for its one lane of 8 elements: the tables
// alone are 56 instructions a thread (sm_90 SASS of a kernel that only builds them, against one that does not),
// 7 of an element's ~194 (the third round's ncu), the prologue a few more. Resident CTAs loop over the blocks
// instead and build the tables once. 0 where the device cannot say (no cap then). Asked per instantiation: their
// registers may differ.
template <bool kMasterBf16, bool kGradBf16, bool kOperand>
int int8_resident_ctas() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};  // 0: not asked yet; two first launches store the same value
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 0;
  if (const int known = cached[device].load(std::memory_order_relaxed); known > 0) return known;
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, int8_kernel<kMasterBf16, kGradBf16, kOperand>, kThreads,
                                                    0) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const int resident = sms * (per_sm > 0 ? per_sm : 1);
  cached[device].store(resident, std::memory_order_relaxed);
  return resident;
}

}  // namespace

int launch_adamw_step(const adamw::ParamView& p, const adamw::StepScalars& s, void* stream, int max_ctas) {
  if (p.rows < 0 || p.cols < 0 || p.stored_cols < p.cols || !p.master || !p.grad || !p.exp_avg || !p.exp_avg_sq)
    return static_cast<int>(cudaErrorInvalidValue);
  // The operand: whole 16-blocks a row.
  if (p.operand != nullptr && p.cols % codec::kBlock != 0)
    return static_cast<int>(cudaErrorInvalidValue);
  if (p.rows == 0 || p.cols == 0) return 0;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (p.moments) {
    case Moments::f32:
    case Moments::bf16: {
      const int grid = grid_for(p.rows * p.cols, kThreads * kPlainPerThread, max_ctas);
      const bool bf16 = p.moments == Moments::bf16, operand = p.operand != nullptr;
      // The two splits take the same tile (kThreads lanes of four elements): the same grid.
      static_assert(kPlainPerThread == adamw::plain_lanes::kPerLane, "one grid for both plain splits");
      if (bf16 && operand) plain_operand_kernel<true><<<grid, kThreads, 0, cuda_stream>>>(p, s);
      if (bf16 && !operand) plain_kernel<true><<<grid, kThreads, 0, cuda_stream>>>(p, s);
      if (!bf16 && operand) plain_operand_kernel<false><<<grid, kThreads, 0, cuda_stream>>>(p, s);
      if (!bf16 && !operand) plain_kernel<false><<<grid, kThreads, 0, cuda_stream>>>(p, s);
      break;
    }
    case Moments::int8: {
      if (p.stored_cols % adamw::kInt8Block != 0 || !p.exp_avg_scale || !p.exp_avg_sq_scale)
        return static_cast<int>(cudaErrorInvalidValue);
      const int64_t blocks = p.rows * (p.stored_cols / adamw::kInt8Block);
      const int per_cta = kThreads / adamw::int8_lanes::kLanesPerBlock;
      const auto launch = [&](auto master_bf16, auto grad_bf16, auto operand) {
        constexpr bool kMaster = decltype(master_bf16)::value, kGrad = decltype(grad_bf16)::value;
        constexpr bool kOperand = decltype(operand)::value;
        const int cap = max_ctas > 0 ? max_ctas : int8_resident_ctas<kMaster, kGrad, kOperand>();
        int8_kernel<kMaster, kGrad, kOperand><<<grid_for(blocks, per_cta, cap), kThreads, 0, cuda_stream>>>(p, s);
      };
      with_dtypes(p, [&](auto master_bf16, auto grad_bf16) {
        if (p.operand != nullptr) launch(master_bf16, grad_bf16, std::true_type{});
        else launch(master_bf16, grad_bf16, std::false_type{});
      });
      break;
    }
    case Moments::nvfp4:
      if (p.stored_cols % adamw::kNvfp4Block != 0 || !p.exp_avg_scale || !p.exp_avg_sq_scale || !p.exp_avg_row_scale ||
          !p.exp_avg_sq_row_scale)
        return static_cast<int>(cudaErrorInvalidValue);
      with_dtypes(p, [&](auto master_bf16, auto grad_bf16) {
        constexpr bool kMaster = decltype(master_bf16)::value, kGrad = decltype(grad_bf16)::value;
        const int grid = grid_for(p.rows, 1, max_ctas);
        if (p.operand != nullptr) nvfp4_kernel<kMaster, kGrad, true><<<grid, kNvfp4Threads, 0, cuda_stream>>>(p, s);
        else nvfp4_kernel<kMaster, kGrad, false><<<grid, kNvfp4Threads, 0, cuda_stream>>>(p, s);
      });
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace qwen3::kernels
