// Streams one NVFP4 pair into a DatWriter from fp32 rows given a chunk at a time: the qdata entry first
// (codes written as each chunk is quantized), then the scale entry. Only the scales ([rows, cols/16] bytes)
// are held until the end, so a 151936 x 2560 tensor never needs a dense copy in memory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "qwen3/dat/dat.h"
#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3 {

class Nvfp4PairWriter {
 public:
  // `weight_key` is the dense name ("...q_proj.weight"); entries become weight_key + ".qdata" / ".scale".
  Nvfp4PairWriter(DatWriter& writer, const std::string& weight_key, int64_t rows, int64_t cols,
                  nvfp4::ScaleMode mode, ElemType qdata_type = ElemType::UInt8, bool measure_error = false);
  // Quantizes and writes the next `n_rows` rows (row-major fp32, `cols` wide).
  void add_rows(const float* rows, int64_t n_rows);
  // Writes the scale entry; all rows must have been added.
  void finish();

  // With measure_error: sum of squared round-trip error and of squared input, for a relative error.
  double sum_sq_error() const { return sum_sq_error_; }
  double sum_sq_input() const { return sum_sq_input_; }

 private:
  DatWriter& writer_;
  std::string weight_key_;
  int64_t rows_, cols_, rows_done_ = 0;
  nvfp4::ScaleMode mode_;
  bool measure_error_;
  std::vector<uint8_t> scales_;
  std::vector<uint8_t> codes_chunk_;
  std::vector<float> dequant_chunk_;
  double sum_sq_error_ = 0, sum_sq_input_ = 0;
};

}  // namespace qwen3
