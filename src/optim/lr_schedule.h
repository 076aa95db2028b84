// Learning-rate schedules: `constant` and `cosine`, both with an optional linear warmup.
//
// `step` is the 0-based index of the training step (0 .. total_steps - 1), counting steps
// that fp16 skipped (as a PyTorch LR scheduler stepped every iteration does); the schedule
// is a pure function of it, so a resumed run gets the same rates. The shape is nanoGPT's
// and llm.c's:
//
//   step < warmup_steps:  max_lr * (step + 1) / warmup_steps     (reaches max_lr at warmup - 1)
//   constant, after:      max_lr
//   cosine, after:        min_lr + 0.5 * (1 + cos(pi * r)) * (max_lr - min_lr),
//                         r = (step - warmup_steps) / (total_steps - warmup_steps)
//                         so step == warmup_steps gives max_lr, and the rate falls towards
//                         min_lr, which it reaches at step == total_steps; steps past
//                         total_steps stay at min_lr.
// Computed in double; the last warmup step, the first decay step and every step from
// total_steps on give max_lr or min_lr exactly. Immutable after construction;
// thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace zerodp {

enum class LrScheduleKind { kConstant, kCosine };

// "constant" or "cosine"; throws InvalidArgument naming the value and the options.
LrScheduleKind parse_lr_schedule(std::string_view name);
std::string_view to_string(LrScheduleKind kind);

struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  double max_lr = 1e-3;                         // the peer's constant rate
  int64_t warmup_steps = 0;                     // 0 = no warmup
  int64_t total_steps = 0;                      // cosine: the step at which the rate reaches min_lr
  std::optional<double> min_lr = std::nullopt;  // cosine floor; unset = kDefaultMinLrRatio * max_lr
  static constexpr double kDefaultMinLrRatio = 0.1;
};

class LrSchedule {
 public:
  // Throws InvalidArgument naming the field unless: max_lr finite and >= 0,
  // 0 <= min_lr <= max_lr, warmup_steps >= 0, and for cosine total_steps > warmup_steps.
  explicit LrSchedule(const LrScheduleConfig& config);

  // Throws InvalidArgument for step < 0.
  double lr_at(int64_t step) const;

  LrScheduleKind kind() const { return kind_; }
  double max_lr() const { return max_lr_; }
  double min_lr() const { return min_lr_; }
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  LrScheduleKind kind_;
  double max_lr_;
  double min_lr_;
  int64_t warmup_steps_;
  int64_t total_steps_;
};

}  // namespace zerodp
