#include "optim/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {

double sum_of_squares(std::span<const float> x) {
  // Independent lanes let the compiler vectorize without reassociating anything.
  constexpr size_t kLanes = 16;
  double lane[kLanes] = {};
  const size_t n = x.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      const double xi = x[i + k];
      lane[k] += xi * xi;
    }
  }
  for (size_t width = kLanes / 2; width > 0; width /= 2) {
    for (size_t k = 0; k < width; ++k) lane[k] += lane[k + width];
  }
  double sum = lane[0];
  for (; i < n; ++i) {
    const double xi = x[i];
    sum += xi * xi;
  }
  return sum;
}

double grad_norm(double global_sum_of_squares) { return std::sqrt(global_sum_of_squares); }

float clip_coefficient(double norm, double max_norm) {
  if (!std::isfinite(max_norm) || max_norm < 0) {
    throw InvalidArgument(fmt::format(
        "clip: max norm {} is invalid; use a finite value > 0, or 0 to turn clipping off",
        max_norm));
  }
  if (max_norm == 0) return 1.0f;
  if (std::isnan(norm)) return std::numeric_limits<float>::quiet_NaN();
  return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

}  // namespace zerodp
