// Where a step on a GPU takes a slower path than the one it is built for (and the step-time model counts): a
// fused kernel's conditions not met, attention off the flash kernel, a product that cannot write its dtype. Each
// such place records what it fell back from and why; the trainer reads the records after every step and warns
// (docs/trainer.md, "Slow paths"). On a CPU the reference ops are the designed path: nothing is recorded there.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace qwen3 {

struct SlowPath {
  std::string what;  // the fast path missed: "fused q/k norm with RoPE"
  std::string why;   // the condition that sent it elsewhere: "rows not 16-byte aligned"
  int64_t count = 0;  // how often since the last take_slow_paths()
};

// One more fall-back of `what` for `why`. Thread-safe; a lock and a map lookup, taken only on a slow path.
void record_slow_path(const std::string& what, const std::string& why);
// The records since the last call (ordered by what, then why), and clears them.
std::vector<SlowPath> take_slow_paths();

// "WHAT (WHY), N times": how every report names a path.
std::string slow_path_text(const SlowPath& path);

// What the trainer warns of after step `step` (0: its set-up): a line for each path of `taken` not yet in
// `totals`, the run's counts so far, into which every path of `taken` is merged (by what and why).
std::vector<std::string> slow_path_warnings(int64_t step, const std::vector<SlowPath>& taken,
                                            std::vector<SlowPath>& totals);

}  // namespace qwen3
