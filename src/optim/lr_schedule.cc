#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {

LrScheduleKind parse_lr_schedule(std::string_view name) {
  if (name == "constant") return LrScheduleKind::kConstant;
  if (name == "cosine") return LrScheduleKind::kCosine;
  throw InvalidArgument(
      fmt::format("unknown lr schedule '{}'; expected one of: constant, cosine", name));
}

std::string_view to_string(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kCosine:
      return "cosine";
  }
  return "unknown";
}

LrSchedule::LrSchedule(const LrScheduleConfig& c)
    : kind_(c.kind),
      max_lr_(c.max_lr),
      min_lr_(c.min_lr.value_or(LrScheduleConfig::kDefaultMinLrRatio * c.max_lr)),
      warmup_steps_(c.warmup_steps),
      total_steps_(c.total_steps) {
  if (!std::isfinite(max_lr_) || max_lr_ < 0) {
    throw InvalidArgument(fmt::format("lr schedule: max lr {} must be finite and >= 0", max_lr_));
  }
  if (!std::isfinite(min_lr_) || min_lr_ < 0 || min_lr_ > max_lr_) {
    throw InvalidArgument(
        fmt::format("lr schedule: min lr {} must be in [0, max lr {}]", min_lr_, max_lr_));
  }
  if (warmup_steps_ < 0) {
    throw InvalidArgument(fmt::format("lr schedule: warmup steps {} must be >= 0", warmup_steps_));
  }
  if (kind_ == LrScheduleKind::kCosine && total_steps_ <= warmup_steps_) {
    throw InvalidArgument(
        fmt::format("lr schedule: cosine needs total steps ({}) greater than warmup steps ({})",
                    total_steps_, warmup_steps_));
  }
}

double LrSchedule::lr_at(int64_t step) const {
  if (step < 0) {
    throw InvalidArgument(fmt::format("lr schedule: step {} is negative; steps are 0-based", step));
  }
  if (step < warmup_steps_) {
    // The fraction first, so the last warmup step gives exactly max_lr.
    return max_lr_ * (static_cast<double>(step + 1) / static_cast<double>(warmup_steps_));
  }
  if (kind_ == LrScheduleKind::kConstant) return max_lr_;
  if (step >= total_steps_) return min_lr_;
  const double ratio =
      static_cast<double>(step - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  // = min_lr + coeff * (max_lr - min_lr), written so that ratio 0 gives exactly max_lr.
  return max_lr_ - (1.0 - coeff) * (max_lr_ - min_lr_);
}

}  // namespace zerodp
