// The slow-path records (include/qwen3/base/slow_paths.h): a process-wide map under a mutex.
#include "qwen3/base/slow_paths.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

namespace qwen3 {
namespace {

std::mutex& records_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::pair<std::string, std::string>, int64_t>& records() {
  static std::map<std::pair<std::string, std::string>, int64_t> r;
  return r;
}

}  // namespace

void record_slow_path(const std::string& what, const std::string& why) {
  const std::lock_guard<std::mutex> lock(records_mutex());
  ++records()[{what, why}];
}

std::vector<SlowPath> take_slow_paths() {
  std::map<std::pair<std::string, std::string>, int64_t> taken;
  {
    const std::lock_guard<std::mutex> lock(records_mutex());
    taken.swap(records());
  }
  std::vector<SlowPath> out;
  for (const auto& [key, count] : taken) out.push_back({key.first, key.second, count});
  return out;
}

std::string slow_path_text(const SlowPath& p) {
  return p.what + " (" + p.why + "), " + std::to_string(p.count) + (p.count == 1 ? " time" : " times");
}

std::vector<std::string> slow_path_warnings(int64_t step, const std::vector<SlowPath>& taken,
                                            std::vector<SlowPath>& totals) {
  std::vector<std::string> lines;
  for (const SlowPath& p : taken) {
    const auto same = [&](const SlowPath& t) { return t.what == p.what && t.why == p.why; };
    const auto known = std::find_if(totals.begin(), totals.end(), same);
    if (known != totals.end()) {
      known->count += p.count;
      continue;
    }
    totals.push_back(p);
    lines.push_back((step > 0 ? "step " + std::to_string(step) : std::string("set-up")) + ": slower path: " +
                    slow_path_text(p));
  }
  return lines;
}

}  // namespace qwen3
