#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "qwen3/base/enum_names.h"
#include "qwen3/base/error.h"
#include "qwen3/optim/optim.h"

namespace qwen3 {

const char* to_string(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::constant: return "constant";
    case LrScheduleKind::cosine: return "cosine";
    case LrScheduleKind::linear: return "linear";
  }
  return "?";
}

LrScheduleKind parse_lr_schedule_kind(const std::string& name) {
  const LrScheduleKind all[] = {LrScheduleKind::constant, LrScheduleKind::cosine, LrScheduleKind::linear};
  return enum_from_name(name, all, "LR schedule");
}

void LrSchedule::validate() const {
  if (!(lr >= 0 && std::isfinite(lr))) throw UsageError("learning rate must be >= 0, got " + std::to_string(lr));
  if (!(min_lr >= 0 && min_lr <= lr))
    throw UsageError(fmt::format("min LR must be in [0, lr]: got {:g} with lr {:g}", min_lr, lr));
  if (warmup_steps < 0) throw UsageError("warmup steps must be >= 0, got " + std::to_string(warmup_steps));
  if (total_steps < 1) throw UsageError("total steps must be >= 1, got " + std::to_string(total_steps));
}

double LrSchedule::at(int64_t step) const {
  validate();
  if (step < 0) throw Error("LR schedule: negative step " + std::to_string(step));
  // (step + 1) / warmup: the first step already moves, the last warmup step runs at the full rate.
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == LrScheduleKind::constant) return lr;
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / decay_steps);
  const double remaining = kind == LrScheduleKind::cosine ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0 - progress;
  return min_lr + (lr - min_lr) * remaining;
}

}  // namespace qwen3
