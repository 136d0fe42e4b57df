// Best-fit decreasing: whole samples into rows of a fixed capacity, as TRL's and axolotl's "bfd" packing does,
// so that a packed row holds complete samples and attention can run per sample (one document per segment)
// rather than under a mask that cuts samples at row borders.
#pragma once
#include <cstdint>
#include <vector>

namespace qwen3::data {

// Rows as consecutive runs of `row_samples`: row r is row_samples[row_begin[r] .. row_begin[r + 1]), each an
// index into the `lengths` given.
struct PackedRowPlan {
  std::vector<int64_t> row_samples;
  std::vector<int64_t> row_begin;  // rows + 1 offsets
  int64_t rows() const { return static_cast<int64_t>(row_begin.size()) - 1; }
};

// Places every length (each 1 ..= capacity) in the open row with the least room that still fits it, longest
// first (ties in the order given), opening a row when none fits; rows in the order they were opened, a row's
// samples in the order they were placed. Deterministic, O(n log n). The number of rows depends on the lengths
// alone, not on their order.
PackedRowPlan best_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity);

}  // namespace qwen3::data
