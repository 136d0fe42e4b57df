#include "data/sample_order.h"

#include <limits>
#include <numeric>
#include <utility>

namespace qwen3::data {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): one 64-bit state, good enough statistics for shuffling.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound): values from the incomplete last run of `bound` are rejected, so no index is favoured.
  uint64_t below(uint64_t bound) {
    const uint64_t max = std::numeric_limits<uint64_t>::max();
    const uint64_t limit = max - (max % bound + 1) % bound;
    uint64_t r;
    do r = next(); while (r > limit);
    return r % bound;
  }

 private:
  uint64_t state_;
};

// Nearby (seed, epoch) pairs must give unrelated streams: mix the seed first, then fold the epoch in.
uint64_t epoch_state(uint64_t seed, int64_t epoch) {
  SplitMix64 seed_mixer(seed);
  SplitMix64 epoch_mixer(seed_mixer.next() ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ULL));
  return epoch_mixer.next();
}

}  // namespace

std::vector<int64_t> sample_order(int64_t count, SampleMode mode, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (mode == SampleMode::sequential) return order;
  SplitMix64 rng(epoch_state(seed, epoch));
  for (int64_t i = count - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

}  // namespace qwen3::data
