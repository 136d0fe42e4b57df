// Host buffers of one parameter in the layout the AdamW kernel's launcher expects, a step's scalars, and three
// steps compared with the CPU step: shared by the kernel's GPU test (tests/gpu/test_adamw_kernel.cpp) and the host
// runs of its int8 and nvfp4 work splits (tests/test_adamw_int8_lanes.cpp, tests/test_adamw_nvfp4_lanes.cpp).
// Plain vectors; no libtorch, no CUDA.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "adamw_update.cuh"
#include "optim/adamw_step.h"
#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3::adamw_test {

namespace ka = kernels::adamw;

inline uint32_t hash32(uint64_t x) { return ka::random_bits(0x5EED5EED12345678ULL, x); }

// Host copies of one parameter's buffers, in the layout the launcher expects.
struct HostParam {
  int64_t rows, cols, stored;
  ka::Moments moments;
  bool bf16_master, bf16_grad;
  std::vector<uint8_t> master, grad, exp_avg, exp_avg_sq, exp_avg_scale, exp_avg_sq_scale, m_row, v_row;

  HostParam(int64_t r, int64_t c, ka::Moments kind, bool bf16m, bool bf16g)
      : rows(r), cols(c), moments(kind), bf16_master(bf16m), bf16_grad(bf16g) {
    const int64_t block = kind == ka::Moments::int8 ? ka::kInt8Block : (kind == ka::Moments::nvfp4 ? ka::kNvfp4Block : 1);
    stored = (cols + block - 1) / block * block;
    master.resize(rows * cols * (bf16m ? 2 : 4));
    grad.resize(rows * cols * (bf16g ? 2 : 4));
    const int64_t state_bytes = kind == ka::Moments::f32 ? 4 * rows * cols
                                : kind == ka::Moments::bf16 ? 2 * rows * cols
                                : kind == ka::Moments::int8 ? rows * stored
                                                            : rows * stored / 2;
    exp_avg.assign(state_bytes, 0);
    exp_avg_sq.assign(state_bytes, 0);
    const int64_t scale_bytes = kind == ka::Moments::int8 ? 4 * rows * stored / block : rows * stored / block;
    if (kind == ka::Moments::int8 || kind == ka::Moments::nvfp4) exp_avg_scale.assign(scale_bytes, 0), exp_avg_sq_scale.assign(scale_bytes, 0);
    if (kind == ka::Moments::nvfp4) {
      m_row.resize(4 * rows), v_row.resize(4 * rows);
      for (int64_t i = 0; i < rows; ++i) {
        const float one = 1.0f;
        std::memcpy(&m_row[4 * i], &one, 4), std::memcpy(&v_row[4 * i], &one, 4);
      }
    }
    for (int64_t i = 0; i < rows * cols; ++i) write(master, bf16m, i, (static_cast<int32_t>(hash32(i)) * 0x1p-31f));
  }
  static void write(std::vector<uint8_t>& buffer, bool bf16, int64_t i, float x) {
    if (bf16) {
      const uint16_t b = ka::bf16_nearest(x);
      std::memcpy(&buffer[2 * i], &b, 2);
    } else {
      std::memcpy(&buffer[4 * i], &x, 4);
    }
  }
  static float read(const std::vector<uint8_t>& buffer, bool bf16, int64_t i) {
    if (bf16) {
      uint16_t b;
      std::memcpy(&b, &buffer[2 * i], 2);
      return ka::bf16_to_float(b);
    }
    float x;
    std::memcpy(&x, &buffer[4 * i], 4);
    return x;
  }
  void set_grad(uint64_t step) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint32_t h = hash32(step * 1000003 + i);
      const float scale = static_cast<float>(1u << 20 >> (h % 20)) * 0x1p-20f;
      write(grad, bf16_grad, i, h % 13 == 0 ? 0.0f : static_cast<int32_t>(h) * 0x1p-31f * scale);
    }
  }
  ka::ParamView view(uint8_t* m, uint8_t* g, uint8_t* ea, uint8_t* eas, uint8_t* eas_scale, uint8_t* eass, uint8_t* mr,
                     uint8_t* vr) const {
    ka::ParamView p{};
    p.master = m, p.master_bf16 = bf16_master, p.grad = g, p.grad_bf16 = bf16_grad;
    p.exp_avg = ea, p.exp_avg_sq = eas, p.exp_avg_scale = eas_scale, p.exp_avg_sq_scale = eass;
    p.exp_avg_row_scale = reinterpret_cast<float*>(mr), p.exp_avg_sq_row_scale = reinterpret_cast<float*>(vr);
    p.rows = rows, p.cols = cols, p.stored_cols = stored, p.moments = moments;
    return p;
  }
};

inline ka::StepScalars scalars_for(int step, bool clip) {
  ka::StepScalars s{};
  s.beta1 = 0.9f, s.one_minus_beta1 = static_cast<float>(1 - 0.9), s.beta2 = 0.999f;
  s.one_minus_beta2 = static_cast<float>(1 - 0.999);
  ka::set_bias_correction2(s, static_cast<float>(std::sqrt(1 - std::pow(0.999, step))));
  s.eps = 1e-8f, s.neg_step_size = static_cast<float>(-1e-2 / (1 - std::pow(0.9, step)));
  s.decay_factor = static_cast<float>(1 - 1e-2 * 0.05), s.grad_scale = clip ? 0.37f : 1.0f;
  s.random_key = 0x1122334455667788ULL + static_cast<uint64_t>(step);
  return s;
}

// Three steps of a parameter of each test shape through the CPU step and through `split` (a host run of a
// kernel's work split: split(view, scalars)), then every buffer compared byte for byte. Shapes: rows shorter
// than a block, padded rows, a Qwen3-4B hidden-size row, many short rows.
template <typename Split>
void expect_split_equals_cpu_step(ka::Moments kind, bool bf16_master, bool bf16_grad, Split split) {
  for (const auto& shape : {std::pair<int64_t, int64_t>{13, 37}, {1, 29}, {7, 2560}, {300, 80}}) {
    HostParam cpu(shape.first, shape.second, kind, bf16_master, bf16_grad);
    HostParam host_split = cpu;
    const auto view = [](HostParam& h) {
      return h.view(h.master.data(), h.grad.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.exp_avg_scale.data(),
                    h.exp_avg_sq_scale.data(), h.m_row.empty() ? nullptr : h.m_row.data(),
                    h.v_row.empty() ? nullptr : h.v_row.data());
    };
    for (int step = 1; step <= 3; ++step) {
      cpu.set_grad(step);
      host_split.set_grad(step);
      const ka::StepScalars s = scalars_for(step, step == 2);
      optim_detail::adamw_step_cpu(view(cpu), s, 0);
      split(view(host_split), s);
    }
    const auto shape_text = std::to_string(shape.first) + " x " + std::to_string(shape.second);
    EXPECT_EQ(host_split.master, cpu.master) << shape_text;
    EXPECT_EQ(host_split.exp_avg, cpu.exp_avg) << shape_text;
    EXPECT_EQ(host_split.exp_avg_sq, cpu.exp_avg_sq) << shape_text;
    EXPECT_EQ(host_split.exp_avg_scale, cpu.exp_avg_scale) << shape_text;
    EXPECT_EQ(host_split.exp_avg_sq_scale, cpu.exp_avg_sq_scale) << shape_text;
    EXPECT_EQ(host_split.m_row, cpu.m_row) << shape_text;
    EXPECT_EQ(host_split.v_row, cpu.v_row) << shape_text;
  }
}

// --keep-weight-operands always: three steps of `split` (split(view, scalars, pieces), a host run of a kernel's
// work split with view.operand set), after each of which the operand must be the CPU codec's quantize and
// dequantize of the stepped master, bf16 bit for bit: both scale modes, both masters, by pieces and by elements.
// Rows of 2560 and 80 columns, and 48 (for int8 one 64-block a row whose last two lanes lie past the row); eight
// sentinels past the operand must stay, and the non-finite flag down.
template <typename Split>
void expect_operand_is_the_codecs(ka::Moments kind, Split split) {
  for (const bool bf16_master : {true, false})
    for (const nvfp4::ScaleMode mode : {nvfp4::ScaleMode::rne, nvfp4::ScaleMode::search})
      for (const bool pieces : {true, false})
        for (const auto& shape : {std::pair<int64_t, int64_t>{7, 2560}, {300, 80}, {5, 48}}) {
          const int64_t rows = shape.first, cols = shape.second;
          HostParam h(rows, cols, kind, bf16_master, /*bf16_grad=*/true);
          std::vector<uint16_t> operand(rows * cols + 8, 0xDEADu);
          int flag = 0;
          for (int step = 1; step <= 3; ++step) {
            h.set_grad(step);
            ka::ParamView p = h.view(h.master.data(), h.grad.data(), h.exp_avg.data(), h.exp_avg_sq.data(),
                                     h.exp_avg_scale.data(), h.exp_avg_sq_scale.data(),
                                     h.m_row.empty() ? nullptr : h.m_row.data(),
                                     h.v_row.empty() ? nullptr : h.v_row.data());
            p.operand = operand.data();
            p.operand_search = mode == nvfp4::ScaleMode::search ? 1 : 0;
            p.operand_nonfinite_flag = &flag;
            split(p, scalars_for(step, step == 2), pieces);
            std::vector<float> master(rows * cols), want(rows * cols);
            for (int64_t i = 0; i < rows * cols; ++i) master[i] = HostParam::read(h.master, bf16_master, i);
            std::vector<uint8_t> codes(rows * cols / 2), scales(rows * cols / 16);
            nvfp4::quantize_rows_cpu(master.data(), rows, cols, codes.data(), scales.data(), mode);
            nvfp4::dequantize_rows_cpu(codes.data(), scales.data(), rows, cols, want.data());
            const std::string what = std::to_string(rows) + " x " + std::to_string(cols) + ", step " +
                                     std::to_string(step) + (bf16_master ? ", bf16" : ", fp32") + " master, " +
                                     nvfp4::scale_mode_name(mode) + (pieces ? "" : ", elements");
            int64_t wrong = 0;
            for (int64_t i = 0; i < rows * cols; ++i) wrong += operand[i] != ka::bf16_nearest(want[i]) ? 1 : 0;
            EXPECT_EQ(wrong, 0) << what;
            for (int64_t i = rows * cols; i < rows * cols + 8; ++i) EXPECT_EQ(operand[i], 0xDEADu) << what;
          }
          EXPECT_EQ(flag, 0);
        }
}

}  // namespace qwen3::adamw_test
