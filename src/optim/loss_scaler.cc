#include "optim/loss_scaler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {
namespace {

bool is_power_of_two(float x) {
  if (!std::isfinite(x) || x <= 0) return false;
  int exponent = 0;
  return std::frexp(x, &exponent) == 0.5f;
}

void check_scale(std::string_view name, float value) {
  if (!is_power_of_two(value)) {
    throw InvalidArgument(fmt::format(
        "loss scaler: {} {} is not a power of two; zerodp keeps unscaling exact (e.g. 65536)", name,
        value));
  }
}

}  // namespace

bool all_finite(std::span<const float> x) {
  // Exponent all ones <=> Inf or NaN. An OR over bit tests vectorizes and has no branch.
  constexpr uint32_t kExponent = 0x7f800000u;
  uint32_t bad = 0;
  for (const float f : x)
    bad |= static_cast<uint32_t>((std::bit_cast<uint32_t>(f) & kExponent) == kExponent);
  return bad == 0;
}

LossScaler::LossScaler(const LossScalerConfig& config)
    : LossScaler(config, LossScalerState{.scale = config.initial_scale,
                                         .clean_steps = 0,
                                         .hysteresis_left = config.hysteresis}) {}

LossScaler::LossScaler(const LossScalerConfig& config, const LossScalerState& state)
    : config_(config), state_(state) {
  check_scale("initial scale", config.initial_scale);
  check_scale("min scale", config.min_scale);
  check_scale("max scale", config.max_scale);
  if (!(config.min_scale <= config.initial_scale && config.initial_scale <= config.max_scale)) {
    throw InvalidArgument(
        fmt::format("loss scaler: need min scale {} <= initial scale {} <= max scale {}",
                    config.min_scale, config.initial_scale, config.max_scale));
  }
  if (config.growth_interval < 1) {
    throw InvalidArgument(
        fmt::format("loss scaler: growth interval {} must be >= 1", config.growth_interval));
  }
  if (config.hysteresis < 1) {
    throw InvalidArgument(fmt::format(
        "loss scaler: hysteresis {} must be >= 1 (1 halves the scale at every overflow)",
        config.hysteresis));
  }
  if (!is_power_of_two(state.scale) || state.scale < config.min_scale ||
      state.scale > config.max_scale) {
    throw InvalidArgument(
        fmt::format("loss scaler state: scale {} is not a power of two in [{}, {}]", state.scale,
                    config.min_scale, config.max_scale));
  }
  if (state.clean_steps < 0 || state.clean_steps >= config.growth_interval) {
    throw InvalidArgument(
        fmt::format("loss scaler state: clean steps {} is outside [0, growth interval {})",
                    state.clean_steps, config.growth_interval));
  }
  if (state.hysteresis_left < 1 || state.hysteresis_left > config.hysteresis) {
    throw InvalidArgument(
        fmt::format("loss scaler state: hysteresis left {} is outside [1, hysteresis {}]",
                    state.hysteresis_left, config.hysteresis));
  }
}

StepAction LossScaler::update(bool overflow) {
  if (overflow) {
    state_.clean_steps = 0;
    if (state_.hysteresis_left > 1) {
      --state_.hysteresis_left;
    } else {
      state_.scale = std::max(state_.scale * 0.5f, config_.min_scale);
    }
    return StepAction::kSkip;
  }
  if (++state_.clean_steps == config_.growth_interval) {
    state_.clean_steps = 0;
    state_.hysteresis_left = config_.hysteresis;
    state_.scale = std::min(state_.scale * 2.0f, config_.max_scale);
  }
  return StepAction::kApply;
}

}  // namespace zerodp
