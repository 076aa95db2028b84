// Dynamic loss scaling for fp16 training, and the overflow check it relies on.
//
// The loss is multiplied by scale() before backward, so small fp16 gradients do not flush to
// zero; the optimizer multiplies gradients by 1 / scale() (AdamW's grad_scale). Each step
// the caller checks its gradients with all_finite(), agrees on the verdict across ranks (any
// rank overflowed => all overflowed), and calls update() once with it. The spec:
//
//   * Start at initial_scale (2^16, as PyTorch's GradScaler and DeepSpeed).
//   * Overflow (any non-finite gradient on any rank): the step is skipped: no parameter,
//     moment or Adam step-counter change. The clean-step counter restarts at 0. If
//     hysteresis_left > 1 it is decremented and the scale is kept (DeepSpeed's delayed
//     shift); otherwise the scale halves, but not below min_scale. At min_scale an overflow
//     keeps the scale and skips the step like any other: the scaler never throws, and
//     at_min_scale() lets the engine decide to stop a run whose gradients overflow even there.
//   * Clean step: applied; the clean-step counter grows by one, and when it reaches
//     growth_interval (2000, as PyTorch's GradScaler; DeepSpeed uses 1000) the scale doubles,
//     but not above max_scale, the counter restarts at 0 and hysteresis_left is refilled.
//   * hysteresis = 1 (default) halves at every overflow. hysteresis = h tolerates h - 1
//     overflows per growth window before halving, then halves at every further one until the
//     next growth refills it (DeepSpeed and Megatron-LM behave the same way).
//
// Scales are powers of two, so unscaling (x * 2^-k) is exact for normal numbers, and
// 1/scale times the clip coefficient in one multiply gives the same bits as unscaling first
// and clipping after. The state is a plain struct that checkpoints save and restore exactly.
// Not thread-safe: one scaler per rank, all updated with the same verdicts.
#pragma once

#include <cstdint>
#include <span>

namespace zerodp {

// True iff no element is NaN or infinite. Checks every element (no early exit), so its cost
// does not depend on the data.
bool all_finite(std::span<const float> x);

struct LossScalerConfig {
  float initial_scale = 65536.0f;  // 2^16
  float min_scale = 1.0f;          // 2^0
  float max_scale = 16777216.0f;   // 2^24
  int64_t growth_interval = 2000;  // consecutive clean steps before the scale doubles
  int32_t hysteresis = 1;          // overflows it takes to halve the scale (>= 1)
};

// Everything that changes; save it with a checkpoint and restore it to continue identically.
struct LossScalerState {
  float scale = 65536.0f;
  int64_t clean_steps = 0;      // clean steps since the last overflow or growth
  int32_t hysteresis_left = 1;  // overflows (counting the next) until the scale halves
  bool operator==(const LossScalerState&) const = default;
};

enum class StepAction { kApply, kSkip };

class LossScaler {
 public:
  // Throws InvalidArgument unless scales are finite powers of two with
  // min_scale <= initial_scale <= max_scale, growth_interval >= 1 and hysteresis >= 1.
  explicit LossScaler(const LossScalerConfig& config);
  // Restores a saved state. Throws InvalidArgument naming the field unless the state is one
  // this config can reach: scale a power of two in [min_scale, max_scale],
  // 0 <= clean_steps < growth_interval, 1 <= hysteresis_left <= hysteresis.
  LossScaler(const LossScalerConfig& config, const LossScalerState& state);

  float scale() const { return state_.scale; }
  // The factor that unscales gradients: exactly 1 / scale().
  float inverse_scale() const { return 1.0f / state_.scale; }
  bool at_min_scale() const { return state_.scale == config_.min_scale; }
  const LossScalerState& state() const { return state_; }
  const LossScalerConfig& config() const { return config_; }

  // Records this step's overflow verdict (the same on every rank) and says whether the
  // optimizer step is applied or skipped.
  [[nodiscard]] StepAction update(bool overflow);

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace zerodp
