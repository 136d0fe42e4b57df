#include "data/packing.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>

#include "qwen3/base/error.h"

namespace qwen3::data {

PackedRowPlan best_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity) {
  std::vector<int64_t> by_length(lengths.size());
  std::iota(by_length.begin(), by_length.end(), int64_t{0});
  std::stable_sort(by_length.begin(), by_length.end(), [&](int64_t a, int64_t b) {
    return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)];
  });
  // Open rows by the room they have left; among rows with equal room the one opened first (a multimap keeps
  // equal keys in insertion order and lower_bound finds the first).
  std::multimap<int64_t, int64_t> room;
  std::vector<std::vector<int64_t>> rows;
  for (const int64_t sample : by_length) {
    const int64_t length = lengths[static_cast<size_t>(sample)];
    if (length < 1 || length > capacity)
      throw Error("best_fit_decreasing: a sample of " + std::to_string(length) + " tokens in rows of " +
                             std::to_string(capacity));
    auto fit = room.lower_bound(length);
    int64_t row = 0, left = 0;
    if (fit == room.end()) {
      row = static_cast<int64_t>(rows.size());
      rows.emplace_back();
      left = capacity - length;
    } else {
      row = fit->second;
      left = fit->first - length;
      room.erase(fit);
    }
    rows[static_cast<size_t>(row)].push_back(sample);
    if (left > 0) room.emplace(left, row);
  }
  PackedRowPlan plan;
  plan.row_samples.reserve(lengths.size());
  plan.row_begin.reserve(rows.size() + 1);
  plan.row_begin.push_back(0);
  for (const auto& r : rows) {
    plan.row_samples.insert(plan.row_samples.end(), r.begin(), r.end());
    plan.row_begin.push_back(static_cast<int64_t>(plan.row_samples.size()));
  }
  return plan;
}

}  // namespace qwen3::data
