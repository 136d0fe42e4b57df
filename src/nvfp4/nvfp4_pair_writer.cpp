#include "qwen3/nvfp4/nvfp4_pair_writer.h"

namespace qwen3 {

Nvfp4PairWriter::Nvfp4PairWriter(DatWriter& writer, const std::string& weight_key, int64_t rows, int64_t cols,
                                 nvfp4::ScaleMode mode, ElemType qdata_type, bool measure_error)
    : writer_(writer), weight_key_(weight_key), rows_(rows), cols_(cols), mode_(mode), measure_error_(measure_error) {
  if (cols % nvfp4::kBlock != 0)
    throw Error("'" + weight_key + "': " + std::to_string(cols) + " columns are not a multiple of 16 (NVFP4 blocks)");
  scales_.resize(static_cast<size_t>(rows * (cols / nvfp4::kBlock)));
  writer_.begin_entry(weight_key + std::string(kQdataSuffix), qdata_type, {rows, cols / 2});
}

void Nvfp4PairWriter::add_rows(const float* rows, int64_t n_rows) {
  if (rows_done_ + n_rows > rows_) throw Error("'" + weight_key_ + "': more rows than the tensor has");
  codes_chunk_.resize(static_cast<size_t>(n_rows * cols_ / 2));
  uint8_t* scales = scales_.data() + rows_done_ * (cols_ / nvfp4::kBlock);
  nvfp4::quantize_rows_cpu(rows, n_rows, cols_, codes_chunk_.data(), scales, mode_);
  writer_.write_payload(codes_chunk_.data(), codes_chunk_.size());
  if (measure_error_) {
    dequant_chunk_.resize(static_cast<size_t>(n_rows * cols_));
    nvfp4::dequantize_rows_cpu(codes_chunk_.data(), scales, n_rows, cols_, dequant_chunk_.data());
    for (size_t i = 0; i < dequant_chunk_.size(); ++i) {
      const double d = static_cast<double>(dequant_chunk_[i]) - rows[i];
      sum_sq_error_ += d * d;
      sum_sq_input_ += static_cast<double>(rows[i]) * rows[i];
    }
  }
  rows_done_ += n_rows;
}

void Nvfp4PairWriter::finish() {
  if (rows_done_ != rows_)
    throw Error("'" + weight_key_ + "': " + std::to_string(rows_done_) + " of " + std::to_string(rows_) + " rows written");
  writer_.write_entry(weight_key_ + std::string(kScaleSuffix), ElemType::Float8E4M3, {rows_, cols_ / nvfp4::kBlock},
                      scales_.data(), scales_.size());
}

}  // namespace qwen3
