// The order of the samples in an epoch. Written out (splitmix64 and a Fisher–Yates shuffle with rejection
// sampling) rather than std::shuffle and std::uniform_int_distribution, whose results differ between standard
// libraries: the same seed must give the same batches on every machine, and after a resume.
#pragma once
#include <cstdint>
#include <vector>

#include "qwen3/data/data.h"

namespace qwen3::data {

// A permutation of [0, count): the identity for sequential; for random, a shuffle drawn from (seed, epoch)
// alone, so each epoch has its own order and any epoch can be recomputed on its own.
std::vector<int64_t> sample_order(int64_t count, SampleMode mode, uint64_t seed, int64_t epoch);

}  // namespace qwen3::data
