// The fused activation kernels (kernels/fused_ops.cu) against their element rules run on the host, on raw
// buffers (any libtorch): RoPE byte for byte, RMSNorm and SwiGLU within the bound of their different
// reductions and exp. The argument checks run without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fused_ops.cuh"
#include "gpu/gpu_test_util.h"
#include "qwen3_kernels.h"

namespace qwen3 {
namespace {

namespace f = kernels::fused;
using gpu_test::DeviceBuffer;
using gpu_test::kInvalidValue;
using kernels::KernelDType;

// Deterministic values in [-scale, scale), as bf16 bit patterns (exact in fp32 too).
std::vector<uint16_t> bf16_values(size_t n, uint64_t key, float scale) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t h = kernels::adamw::random_bits(key, i);
    v[i] = kernels::adamw::bf16_nearest(static_cast<float>(static_cast<int32_t>(h)) * 0x1p-31f * scale);
  }
  return v;
}

template <typename T>
void upload(DeviceBuffer& d, const std::vector<T>& h) {
  ASSERT_EQ(cudaMemcpy(d.at(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <typename T>
void download(std::vector<T>& h, const DeviceBuffer& d) {
  ASSERT_EQ(cudaMemcpy(h.data(), d.at(), h.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
}

float bf(uint16_t b) { return kernels::adamw::bf16_to_float(b); }

// Tables of the rows' positions [T, d], and of every token's [B·T, d] (packed rows: positions restart with each
// sample, here at a different place in each row).
TEST(GpuFusedKernels, RopeEqualsTheHostRuleByteForByte) {
  QWEN3_REQUIRE_GPU();
  const int64_t B = 2, T = 33, heads = 5, d = 128, n = B * T * heads * d;
  const std::vector<uint16_t> x = bf16_values(n, 1, 3.0f);
  for (const int64_t table_rows : {T, B * T}) {
    std::vector<float> cos(table_rows * d), sin(table_rows * d);
    for (int64_t r = 0; r < table_rows; ++r) {
      const int64_t position = table_rows == T ? r : (r % T) % (7 + 4 * (r / T));  // samples of 7 (row 0), 11 (row 1)
      for (int64_t i = 0; i < d; ++i) {
        const double angle = position * std::pow(1e6, -2.0 * (i % (d / 2)) / d);
        cos[r * d + i] = static_cast<float>(std::cos(angle)), sin[r * d + i] = static_cast<float>(std::sin(angle));
      }
    }
    DeviceBuffer dx(n * 2), dout(n * 2), dcos(table_rows * d * 4), dsin(table_rows * d * 4);
    upload(dcos, cos), upload(dsin, sin);
    // Offset 0: 4 pairs a thread (8-byte accesses); 2 bytes: misaligned, a pair a thread.
    for (int backward = 0; backward < 4; ++backward) {
      const size_t offset = backward >= 2 ? 2 : 0;
      ASSERT_EQ(cudaMemcpy(dx.at(offset), x.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(kernels::launch_rope(dx.at(offset), dout.at(offset), KernelDType::bf16, B, T, heads, d,
                                     reinterpret_cast<const float*>(dcos.at()), reinterpret_cast<const float*>(dsin.at()),
                                     table_rows, backward % 2, nullptr), 0);
      std::vector<uint16_t> got(n);
      ASSERT_EQ(cudaMemcpy(got.data(), dout.at(offset), n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      std::vector<uint16_t> want(x);
      for (int64_t row = 0; row < B * T * heads; ++row) {
        const int64_t t = (row / heads) % table_rows;
        for (int64_t i = 0; i < d / 2; ++i) {
          float x1 = bf(x[row * d + i]), x2 = bf(x[row * d + i + d / 2]);
          const float c1 = cos[t * d + i], s1 = sin[t * d + i], c2 = cos[t * d + i + d / 2], s2 = sin[t * d + i + d / 2];
          if (backward % 2) f::rope_pair_backward<true>(x1, x2, c1, s1, c2, s2);
          else f::rope_pair<true>(x1, x2, c1, s1, c2, s2);
          want[row * d + i] = kernels::adamw::bf16_nearest(x1), want[row * d + i + d / 2] = kernels::adamw::bf16_nearest(x2);
        }
      }
      EXPECT_EQ(got, want) << (backward % 2 ? "backward" : "forward") << ", " << table_rows << " table rows, offset "
                           << offset;
    }
  }
}

// n % 8 == 7: 8 elements a thread, then a tail; offset 2 bytes: misaligned, an element a thread.
TEST(GpuFusedKernels, SwigluFollowsTheHostRule) {
  QWEN3_REQUIRE_GPU();
  const int64_t n = 300 * 9728 + 7;
  const std::vector<uint16_t> g = bf16_values(n, 2, 6.0f), u = bf16_values(n, 3, 2.0f), dh = bf16_values(n, 4, 1.0f);
  for (const size_t offset : {size_t{0}, size_t{2}}) {
    DeviceBuffer dg_in(n * 2), du_in(n * 2), ddh(n * 2), dout(n * 2), dgate(n * 2), dup(n * 2);
    const auto put = [&](DeviceBuffer& d, const std::vector<uint16_t>& h) {
      ASSERT_EQ(cudaMemcpy(d.at(offset), h.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    };
    const auto take = [&](std::vector<uint16_t>& h, const DeviceBuffer& d) {
      ASSERT_EQ(cudaMemcpy(h.data(), d.at(offset), n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    };
    put(dg_in, g), put(du_in, u), put(ddh, dh);
    ASSERT_EQ(kernels::launch_swiglu_forward(dg_in.at(offset), du_in.at(offset), dout.at(offset), KernelDType::bf16, n,
                                             nullptr), 0);
    ASSERT_EQ(kernels::launch_swiglu_backward(ddh.at(offset), dg_in.at(offset), du_in.at(offset), dgate.at(offset),
                                              dup.at(offset), KernelDType::bf16, n, nullptr), 0);
    std::vector<uint16_t> out(n), dgv(n), duv(n);
    take(out, dout), take(dgv, dgate), take(duv, dup);
    int64_t beyond_one_step = 0;
    for (int64_t i = 0; i < n; ++i) {
      float dg, du;
      f::swiglu_backward<true>(bf(dh[i]), bf(g[i]), bf(u[i]), dg, du);
      const float want[] = {f::swiglu<true>(bf(g[i]), bf(u[i])), dg, du};
      const float got[] = {bf(out[i]), bf(dgv[i]), bf(duv[i])};
      for (int k = 0; k < 3; ++k)  // exp on the device and in libm differ by an ulp: at most one bf16 step apart
        beyond_one_step += std::fabs(got[k] - want[k]) > std::fabs(want[k]) * (1.0f / 64) + 1e-30f;
    }
    EXPECT_EQ(beyond_one_step, 0) << "offset " << offset;
  }
}

// cols 2560: a CTA a row (rmsnorm_wide_rows.cuh), 2 or 3 pieces of 8 a thread, and column pairs in dw; 5120: the
// widest such rows, 5 pieces each thread; 1032: 129 pieces, the first thread's second one alone; 6144: too wide for
// them, a warp a row, 24 elements a lane; 132 (the vector paths need cols % 8 == 0): an element a lane, pairs in dw;
// 131: no pairs either; 65,536 rows of 128: a q-norm's shape (2,048 tokens x 32 heads), two
// rows a warp, 2,048 chunks of partials in runs of 64 (8,192 rows, runs of 8, under the sanitizers); 517 rows of
// 64: four rows a warp, the last warp's rows partly past the end.
struct NormShape {
  int64_t rows, cols;
};
class GpuRmsNormKernels : public ::testing::TestWithParam<NormShape> {};

// The weight gradient as the kernels sum it (fused_ops.cuh, kDwRuns), from the rstd the forward kernel wrote.
std::vector<float> dw_in_the_kernels_order(const std::vector<uint16_t>& x, const std::vector<uint16_t>& dy,
                                           const std::vector<float>& rstd, int64_t rows, int64_t cols) {
  const int64_t per_chunk = kernels::rmsnorm_rows_per_chunk(rows);
  const int64_t chunks = kernels::rmsnorm_backward_workspace_floats(rows, cols) / cols;
  std::vector<float> partial(chunks * cols, 0.0f), dw(cols);
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    for (int64_t row = chunk * per_chunk; row < std::min(rows, (chunk + 1) * per_chunk); ++row)
      for (int64_t c = 0; c < cols; ++c)
        partial[chunk * cols + c] = f::add_rn(partial[chunk * cols + c],
                                              f::rmsnorm_dw_term<true>(bf(dy[row * cols + c]), f::mul_rn(bf(x[row * cols + c]), rstd[row])));
  for (int64_t c = 0; c < cols; ++c) {
    float total = 0.0f;
    for (int run = 0; run < f::kDwRuns; ++run) {
      float sum = 0.0f;
      for (int64_t chunk = f::dw_run_first(chunks, run); chunk < f::dw_run_first(chunks, run + 1); ++chunk)
        sum = f::add_rn(sum, partial[chunk * cols + c]);
      total = f::add_rn(total, sum);
    }
    dw[c] = total;
  }
  return dw;
}

TEST_P(GpuRmsNormKernels, FollowTheHostRule) {
  QWEN3_REQUIRE_GPU();
  const int64_t cols = GetParam().cols;
  const int64_t rows = test::small_gpu_shapes() ? std::min<int64_t>(GetParam().rows, 8192) : GetParam().rows;
  const std::vector<uint16_t> x = bf16_values(rows * cols, 5, 2.0f), dy = bf16_values(rows * cols, 6, 1.0f);
  std::vector<float> w(cols);
  for (int64_t c = 0; c < cols; ++c) w[c] = 1.0f + 0.1f * bf(bf16_values(1, 7 + c, 1.0f)[0]);
  DeviceBuffer dx_in(rows * cols * 2), dw_in(cols * 4), dy_in(rows * cols * 2), y(rows * cols * 2), rstd(rows * 4),
      dx(rows * cols * 2), dw(cols * 4), work(kernels::rmsnorm_backward_workspace_floats(rows, cols) * 4);
  upload(dx_in, x), upload(dw_in, w), upload(dy_in, dy);
  auto* rstd_d = reinterpret_cast<float*>(rstd.at());
  ASSERT_EQ(kernels::launch_rmsnorm_forward(dx_in.at(), KernelDType::bf16, dw_in.at(), KernelDType::f32, rows, cols, 1e-6f,
                                            y.at(), rstd_d, nullptr), 0);
  ASSERT_EQ(kernels::launch_rmsnorm_backward(dy_in.at(), dx_in.at(), KernelDType::bf16, dw_in.at(), KernelDType::f32,
                                             rstd_d, rows, cols, dx.at(), reinterpret_cast<float*>(dw.at()),
                                             reinterpret_cast<float*>(work.at()), nullptr), 0);
  std::vector<uint16_t> yv(rows * cols), dxv(rows * cols);
  std::vector<float> dwv(cols), rstd_v(rows);
  std::vector<double> dw_want(cols, 0.0);
  download(yv, y), download(dxv, dx), download(dwv, dw), download(rstd_v, rstd);
  double worst_y = 0, worst_dx = 0, dx_scale = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double squares = 0, dot = 0;
    for (int64_t c = 0; c < cols; ++c) squares += double(bf(x[r * cols + c])) * bf(x[r * cols + c]);
    const float rs = f::rmsnorm_rstd(static_cast<float>(squares), cols, 1e-6f);
    for (int64_t c = 0; c < cols; ++c) dot += double(f::rmsnorm_grad_n<true>(bf(dy[r * cols + c]), w[c])) * bf(x[r * cols + c]) * rs;
    for (int64_t c = 0; c < cols; ++c) {
      const float n = bf(x[r * cols + c]) * rs;
      const float want_y = f::rmsnorm_output<true>(bf(x[r * cols + c]), rs, w[c]);
      worst_y = std::max(worst_y, std::fabs(double(bf(yv[r * cols + c])) - want_y) / (std::fabs(want_y) + 1e-30));
      const float want_dx = f::rmsnorm_dx(f::rmsnorm_grad_n<true>(bf(dy[r * cols + c]), w[c]), n, static_cast<float>(dot / cols), rs);
      worst_dx = std::max(worst_dx, std::fabs(double(bf(dxv[r * cols + c])) - want_dx));
      dx_scale = std::max(dx_scale, std::fabs(double(want_dx)));
      dw_want[c] += f::rmsnorm_dw_term<true>(bf(dy[r * cols + c]), n);
    }
  }
  EXPECT_LE(worst_y, 1.0 / 64);
  EXPECT_LE(worst_dx, dx_scale / 64);
  double worst_dw = 0, dw_scale = 0;
  for (int64_t c = 0; c < cols; ++c)
    worst_dw = std::max(worst_dw, std::fabs(double(dwv[c]) - dw_want[c])), dw_scale = std::max(dw_scale, std::fabs(double(dw_want[c])));
  EXPECT_LE(worst_dw, dw_scale * 1e-3);
  // Bit for bit the kernels' order of summation: chunks of rows, runs of chunks, the runs.
  const std::vector<float> dw_order = dw_in_the_kernels_order(x, dy, rstd_v, rows, cols);
  int64_t dw_differ = 0;
  for (int64_t c = 0; c < cols; ++c) dw_differ += std::memcmp(&dwv[c], &dw_order[c], 4) != 0;
  EXPECT_EQ(dw_differ, 0) << "of " << cols << " columns";
  // The weight gradient's reduction has a fixed order: the same bytes on a second run.
  std::vector<float> again(cols);
  ASSERT_EQ(kernels::launch_rmsnorm_backward(dy_in.at(), dx_in.at(), KernelDType::bf16, dw_in.at(), KernelDType::f32,
                                             rstd_d, rows, cols, dx.at(), reinterpret_cast<float*>(dw.at()),
                                             reinterpret_cast<float*>(work.at()), nullptr), 0);
  download(again, dw);
  EXPECT_EQ(0, std::memcmp(again.data(), dwv.data(), cols * 4));
}

INSTANTIATE_TEST_SUITE_P(Widths, GpuRmsNormKernels,
                         ::testing::Values(NormShape{517, 2560}, NormShape{300, 5120}, NormShape{300, 1032},
                                           NormShape{300, 6144}, NormShape{517, 132}, NormShape{517, 131},
                                           NormShape{65536, 128}, NormShape{517, 64}));

// RMSNorm's backward adding the residual stream's gradient (dx_add) gives the bytes of dx, rounded, plus that
// gradient, rounded: what autograd's separate sum gave. bf16 and fp32, on the vector paths (2560: a CTA a row; 6144:
// a warp a row) and off them (131).
TEST(GpuFusedKernels, RmsNormBackwardAddsTheStreamsGradientAsAutogradDid) {
  QWEN3_REQUIRE_GPU();
  for (const bool bf16 : {true, false})
    for (const int64_t cols : {int64_t{2560}, int64_t{6144}, int64_t{131}}) {
      const int64_t rows = 97, n = rows * cols;
      const size_t es = bf16 ? 2 : 4;
      const KernelDType t = bf16 ? KernelDType::bf16 : KernelDType::f32;
      std::vector<uint8_t> x(n * es), dy(n * es), add(n * es);
      const std::vector<uint16_t> xv = bf16_values(n, 51, 2.0f), dyv = bf16_values(n, 52, 1.0f), addv = bf16_values(n, 53, 1.0f);
      for (int64_t i = 0; i < n; ++i) {
        if (bf16) {
          std::memcpy(&x[i * 2], &xv[i], 2), std::memcpy(&dy[i * 2], &dyv[i], 2), std::memcpy(&add[i * 2], &addv[i], 2);
        } else {
          const float a = bf(xv[i]), b = bf(dyv[i]), c = bf(addv[i]) * 1.3f;  // fp32 values off the bf16 grid
          std::memcpy(&x[i * 4], &a, 4), std::memcpy(&dy[i * 4], &b, 4), std::memcpy(&add[i * 4], &c, 4);
        }
      }
      std::vector<float> w(cols, 1.0f);
      for (int64_t c = 0; c < cols; ++c) w[c] += 0.1f * bf(bf16_values(1, 60 + c, 1.0f)[0]);
      DeviceBuffer dx_in(n * es), ddy(n * es), dadd(n * es), dw_in(cols * 4), y(n * es), rstd(rows * 4), plain(n * es),
          summed(n * es), dw(cols * 4), work(kernels::rmsnorm_backward_workspace_floats(rows, cols) * 4);
      upload(dx_in, x), upload(ddy, dy), upload(dadd, add), upload(dw_in, w);
      auto* r = reinterpret_cast<float*>(rstd.at());
      ASSERT_EQ(kernels::launch_rmsnorm_forward(dx_in.at(), t, dw_in.at(), KernelDType::f32, rows, cols, 1e-6f, y.at(), r, nullptr), 0);
      ASSERT_EQ(kernels::launch_rmsnorm_backward(ddy.at(), dx_in.at(), t, dw_in.at(), KernelDType::f32, r, rows, cols, plain.at(),
                                                 reinterpret_cast<float*>(dw.at()), reinterpret_cast<float*>(work.at()), nullptr), 0);
      ASSERT_EQ(kernels::launch_rmsnorm_backward(ddy.at(), dx_in.at(), t, dw_in.at(), KernelDType::f32, r, rows, cols, summed.at(),
                                                 reinterpret_cast<float*>(dw.at()), reinterpret_cast<float*>(work.at()), nullptr,
                                                 dadd.at()), 0);
      std::vector<uint8_t> p(n * es), q(n * es);
      download(p, plain), download(q, summed);
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        float a, b, c;
        if (bf16) {
          uint16_t pa, qa, ad;
          std::memcpy(&pa, &p[i * 2], 2), std::memcpy(&qa, &q[i * 2], 2), std::memcpy(&ad, &add[i * 2], 2);
          a = bf(pa), c = bf(ad);
          b = bf(qa);
          differ += kernels::adamw::bf16_nearest(f::add_rn(a, c)) != qa;
        } else {
          std::memcpy(&a, &p[i * 4], 4), std::memcpy(&b, &q[i * 4], 4), std::memcpy(&c, &add[i * 4], 4);
          const float want = f::add_rn(a, c);
          differ += std::memcmp(&want, &b, 4) != 0;
        }
      }
      EXPECT_EQ(differ, 0) << (bf16 ? "bf16 " : "fp32 ") << cols << " columns";
    }
}

// The q/k norm and RoPE as one pass against the two kernels it replaces (launch_rmsnorm_* over [rows, d], then
// launch_rope), byte for byte: y and rstd forward, dx and dw backward. Widths 64, 128 and 256 (8, 16 and 32 lanes a
// row: 4, 2 and 1 rows a warp), bf16 and fp32 activations, fp32 and bf16 weights, the rows' tables and a table row a
// token, 2 x 33 x 5 rows (the last warp's rows partly past the end, a chunk's last wave short), and a q norm's
// 2,048 tokens x 32 heads (2,048 chunks; 256 tokens under the sanitizers).
struct HeadNormCase {
  int64_t batch, seq, heads, head_dim;
  bool bf16_x, bf16_w, table_per_token;
};

class GpuHeadNormRope : public ::testing::TestWithParam<HeadNormCase> {};

TEST_P(GpuHeadNormRope, IsTheNormThenRopeByteForByte) {
  QWEN3_REQUIRE_GPU();
  HeadNormCase p = GetParam();
  if (test::small_gpu_shapes()) p.seq = std::min<int64_t>(p.seq, 256);
  const int64_t d = p.head_dim, rows = p.batch * p.seq * p.heads, n = rows * d;
  const int64_t table_rows = p.table_per_token ? p.batch * p.seq : p.seq;
  const KernelDType xt = p.bf16_x ? KernelDType::bf16 : KernelDType::f32, wt = p.bf16_w ? KernelDType::bf16 : KernelDType::f32;
  const size_t xs = p.bf16_x ? 2 : 4, ws = p.bf16_w ? 2 : 4;
  // Activations as bf16 values, widened for fp32 runs (exact); the weight near 1.
  const auto widen = [&](const std::vector<uint16_t>& v, bool bf16) {
    std::vector<uint8_t> bytes(v.size() * (bf16 ? 2 : 4));
    for (size_t i = 0; i < v.size(); ++i) {
      if (bf16) std::memcpy(&bytes[i * 2], &v[i], 2);
      else {
        const float f = bf(v[i]);
        std::memcpy(&bytes[i * 4], &f, 4);
      }
    }
    return bytes;
  };
  std::vector<uint16_t> w16(d);
  for (int64_t c = 0; c < d; ++c) w16[c] = kernels::adamw::bf16_nearest(1.0f + 0.1f * bf(bf16_values(1, 40 + c, 1.0f)[0]));
  const std::vector<uint8_t> x = widen(bf16_values(n, 31, 3.0f), p.bf16_x), dy = widen(bf16_values(n, 32, 1.0f), p.bf16_x),
                             w = widen(w16, p.bf16_w);
  std::vector<float> cos(table_rows * d), sin(table_rows * d);
  for (int64_t r = 0; r < table_rows; ++r) {
    const int64_t position = p.table_per_token ? (r % p.seq) % (5 + 6 * (r / p.seq)) : r;
    for (int64_t i = 0; i < d; ++i) {
      const double angle = position * std::pow(1e6, -2.0 * (i % (d / 2)) / d);
      cos[r * d + i] = static_cast<float>(std::cos(angle)), sin[r * d + i] = static_cast<float>(std::sin(angle));
    }
  }
  const int64_t work_floats = kernels::rmsnorm_backward_workspace_floats(rows, d);
  DeviceBuffer dx_in(n * xs), ddy(n * xs), dw_in(d * ws), dcos(cos.size() * 4), dsin(sin.size() * 4), normed(n * xs),
      y_two(n * xs), y_one(n * xs), rstd_two(rows * 4), rstd_one(rows * 4), g(n * xs), dx_two(n * xs), dx_one(n * xs),
      dw_two(d * 4), dw_one(d * 4), work(work_floats * 4);
  upload(dx_in, x), upload(ddy, dy), upload(dw_in, w), upload(dcos, cos), upload(dsin, sin);
  const auto* c = reinterpret_cast<const float*>(dcos.at());
  const auto* s = reinterpret_cast<const float*>(dsin.at());
  const auto f32 = [](DeviceBuffer& b) { return reinterpret_cast<float*>(b.at()); };
  // The two kernels: norm, then RoPE; RoPE backward, then the norm's.
  ASSERT_EQ(kernels::launch_rmsnorm_forward(dx_in.at(), xt, dw_in.at(), wt, rows, d, 1e-6f, normed.at(), f32(rstd_two), nullptr), 0);
  ASSERT_EQ(kernels::launch_rope(normed.at(), y_two.at(), xt, p.batch, p.seq, p.heads, d, c, s, table_rows, 0, nullptr), 0);
  ASSERT_EQ(kernels::launch_rope(ddy.at(), g.at(), xt, p.batch, p.seq, p.heads, d, c, s, table_rows, 1, nullptr), 0);
  ASSERT_EQ(kernels::launch_rmsnorm_backward(g.at(), dx_in.at(), xt, dw_in.at(), wt, f32(rstd_two), rows, d, dx_two.at(),
                                             f32(dw_two), f32(work), nullptr), 0);
  // The one pass each way.
  ASSERT_EQ(kernels::launch_head_norm_rope_forward(dx_in.at(), xt, dw_in.at(), wt, p.batch, p.seq, p.heads, d, 1e-6f, c, s,
                                                   table_rows, y_one.at(), f32(rstd_one), nullptr), 0);
  ASSERT_EQ(kernels::launch_head_norm_rope_backward(ddy.at(), dx_in.at(), xt, dw_in.at(), wt, f32(rstd_one), p.batch, p.seq,
                                                    p.heads, d, c, s, table_rows, dx_one.at(), f32(dw_one), f32(work), nullptr), 0);
  const auto same = [&](const DeviceBuffer& a, const DeviceBuffer& b, size_t bytes) {
    std::vector<uint8_t> ha(bytes), hb(bytes);
    EXPECT_EQ(cudaMemcpy(ha.data(), a.at(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(hb.data(), b.at(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t differ = 0;
    for (size_t i = 0; i < bytes; ++i) differ += ha[i] != hb[i];
    return differ;
  };
  EXPECT_EQ(same(y_one, y_two, n * xs), 0u) << "y";
  EXPECT_EQ(same(rstd_one, rstd_two, rows * 4), 0u) << "rstd";
  EXPECT_EQ(same(dx_one, dx_two, n * xs), 0u) << "dx";
  EXPECT_EQ(same(dw_one, dw_two, d * 4), 0u) << "dw";
  // Not vacuous: the rotation moved the normalized values.
  EXPECT_GT(same(y_one, normed, n * xs), n * xs / 4);
}

INSTANTIATE_TEST_SUITE_P(
    Widths, GpuHeadNormRope,
    ::testing::Values(HeadNormCase{2, 33, 5, 128, true, false, false}, HeadNormCase{2, 33, 5, 128, true, true, true},
                      HeadNormCase{2, 33, 5, 64, true, false, true}, HeadNormCase{2, 33, 5, 256, false, false, false},
                      HeadNormCase{2, 33, 5, 128, false, true, true}, HeadNormCase{1, 2048, 32, 128, true, false, false}));

TEST(FusedKernelLaunch, RejectsBadArgumentsWithoutLaunching) {
  float dummy[4] = {};  // never read: every call is refused before a launch
  EXPECT_EQ(kInvalidValue, kernels::launch_rope(dummy, dummy, KernelDType::bf16, 1, 1, 1, 3, dummy, dummy, 1, 0, nullptr));  // odd d
  EXPECT_EQ(kInvalidValue, kernels::launch_rope(dummy, dummy, KernelDType::f16, 1, 1, 1, 2, dummy, dummy, 1, 0, nullptr));
  // Tables of neither the rows' positions (seq) nor every token's (batch * seq).
  EXPECT_EQ(kInvalidValue, kernels::launch_rope(dummy, dummy, KernelDType::bf16, 2, 3, 1, 2, dummy, dummy, 4, 0, nullptr));
  EXPECT_EQ(kInvalidValue, kernels::launch_swiglu_forward(nullptr, dummy, dummy, KernelDType::f32, 4, nullptr));
  EXPECT_EQ(kInvalidValue, kernels::launch_rmsnorm_forward(dummy, KernelDType::f32, dummy, KernelDType::f32, 1, 0, 1e-6f, dummy, dummy,
                                            nullptr));  // no columns
  EXPECT_EQ(kInvalidValue, kernels::launch_rmsnorm_backward(dummy, dummy, KernelDType::f32, dummy, KernelDType::f32, dummy, 1, 4, dummy,
                                             dummy, nullptr, nullptr));  // no workspace
  EXPECT_EQ(kernels::launch_swiglu_forward(dummy, dummy, dummy, KernelDType::f32, 0, nullptr), 0);  // nothing to do
  // The fused q/k norm and RoPE: widths it does not take (136: 17 pieces; 512: 64 lanes; 8: one piece, no partner),
  // a misaligned activation, tables of neither form, no workspace.
  alignas(16) float buf[64] = {};
  for (const int64_t d : {int64_t{136}, int64_t{512}, int64_t{8}})
    EXPECT_EQ(kInvalidValue, kernels::launch_head_norm_rope_forward(buf, KernelDType::f32, buf, KernelDType::f32, 1, 1, 1, d, 1e-6f,
                                                                    buf, buf, 1, buf, buf, nullptr)) << d;
  EXPECT_EQ(kInvalidValue, kernels::launch_head_norm_rope_forward(buf + 1, KernelDType::f32, buf, KernelDType::f32, 1, 1, 1, 16,
                                                                  1e-6f, buf, buf, 1, buf, buf, nullptr));
  EXPECT_EQ(kInvalidValue, kernels::launch_head_norm_rope_forward(buf, KernelDType::bf16, buf, KernelDType::f32, 2, 3, 1, 16,
                                                                  1e-6f, buf, buf, 4, buf, buf, nullptr));
  EXPECT_EQ(kInvalidValue, kernels::launch_head_norm_rope_backward(buf, buf, KernelDType::bf16, buf, KernelDType::f32, buf, 1,
                                                                   1, 1, 16, buf, buf, 1, buf, buf, nullptr, nullptr));
  EXPECT_EQ(kernels::launch_head_norm_rope_forward(buf, KernelDType::bf16, buf, KernelDType::f32, 0, 1, 1, 16, 1e-6f, buf, buf,
                                                   1, buf, buf, nullptr), 0);  // no rows: nothing to do
  EXPECT_EQ(kernels::rmsnorm_backward_workspace_floats(513, 10), 17 * 10);  // chunks of 32 rows
  // Past 65,535 chunks of 32 the chunks grow: the grid's y limit is never passed.
  EXPECT_EQ(kernels::rmsnorm_rows_per_chunk(2048), 32);
  // Narrow rows share a warp: the q/k norms' 128 columns take 16 lanes; a Qwen3-4B hidden row, or any row off the
  // vector path, all 32.
  EXPECT_EQ(kernels::rmsnorm_row_lanes(128, 1), 16);
  EXPECT_EQ(kernels::rmsnorm_row_lanes(64, 1), 8);
  EXPECT_EQ(kernels::rmsnorm_row_lanes(8, 1), 1);
  EXPECT_EQ(kernels::rmsnorm_row_lanes(136, 1), 32);
  EXPECT_EQ(kernels::rmsnorm_row_lanes(2560, 1), 32);
  EXPECT_EQ(kernels::rmsnorm_row_lanes(128, 0), 32);
  EXPECT_LE(kernels::rmsnorm_backward_workspace_floats(int64_t{1} << 24, 1), 65535);
}

}  // namespace
}  // namespace qwen3
