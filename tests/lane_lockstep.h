// Host stand-in for a group of GPU lanes, so that the kernels' __host__ __device__ lane functions that exchange
// values (kernels/nvfp4_block_lanes.cuh) run on the CPU as written: body(lane, exchange) runs for each lane, and
// exchange(v, d) returns what lane (lane ^ d) passed at the same call, as __shfl_xor_sync does. Every lane must
// make the same calls (as every lane of a warp must take a shuffle).
//
// No threads: the lanes run one after another, each exchange answered from what the partner passed at that call
// in the previous round, and the rounds repeat until nothing passed changes. A value passed at a lane's k-th call
// depends only on answers to its earlier calls, so round k + 1 has every value up to the k-th right, and the last
// round (nothing changed) ran every lane on the answers a warp would have given. The body may run many times: it
// must only overwrite its results (threads in lock-step did the same work, but spent half a minute of the test's
// time in barriers on two cores).
#pragma once
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace qwen3::test {

class LaneLockstep {
 public:
  explicit LaneLockstep(int lanes) : lanes_(lanes) {}

  class Exchange {
   public:
    Exchange(LaneLockstep& group, int lane) : group_(&group), lane_(lane) {}
    float operator()(float v, int d) const {
      std::vector<uint32_t>& mine = group_->passed_[lane_];
      const size_t call = mine.size();
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      mine.push_back(bits);
      const std::vector<uint32_t>& theirs = group_->before_[lane_ ^ d];
      const uint32_t answer = call < theirs.size() ? theirs[call] : 0u;
      float out;
      std::memcpy(&out, &answer, sizeof out);
      return out;
    }

   private:
    LaneLockstep* group_;
    int lane_;
  };

  // After run(): how many exchanges each lane made in the last round (a warp's lanes must all make the same number;
  // a lane that skips a shuffle the others take is undefined on the device).
  std::vector<size_t> exchange_counts() const {
    std::vector<size_t> counts;
    for (const std::vector<uint32_t>& lane : passed_) counts.push_back(lane.size());
    return counts;
  }

  template <typename Body>
  void run(Body body) {
    passed_.assign(lanes_, {});
    for (int round = 0; round < kMaxRounds; ++round) {
      before_ = std::move(passed_);
      passed_.assign(lanes_, {});
      for (int lane = 0; lane < lanes_; ++lane) body(lane, Exchange(*this, lane));
      if (passed_ == before_) return;
    }
    throw std::logic_error("LaneLockstep: the lanes' exchanges did not settle (do they make the same calls?)");
  }

 private:
  static constexpr int kMaxRounds = 1000;
  int lanes_;
  std::vector<std::vector<uint32_t>> passed_, before_;  // a lane's values at each call: this round, the last
};

}  // namespace qwen3::test
