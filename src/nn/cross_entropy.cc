// Softmax cross-entropy, forward and backward in one pass over the logits.
#include "nn/layers.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "nn/check.h"

namespace zerodp {

using nn_detail::check_count;
using nn_detail::check_optional_count;

float cross_entropy_forward_backward(std::span<float> dlogits, std::span<const float> logits,
                                     std::span<const int32_t> targets, size_t rows, size_t V,
                                     float dloss) {
  const std::string shape = fmt::format("(rows={}, V={})", rows, V);
  check_optional_count("cross_entropy_forward_backward", "dlogits", dlogits, rows * V, shape);
  check_count("cross_entropy_forward_backward", "logits", logits, rows * V, shape);
  check_count("cross_entropy_forward_backward", "targets", targets, rows, shape);
  size_t counted = 0;
  for (size_t r = 0; r < rows; ++r) {
    const int32_t t = targets[r];
    if (t == kIgnoreTarget) continue;
    if (t < 0 || static_cast<size_t>(t) >= V) {
      throw InvalidArgument(fmt::format(
          "cross_entropy_forward_backward: target {} at row {} is outside [0, V={}) and is not "
          "kIgnoreTarget ({})",
          t, r, V, kIgnoreTarget));
    }
    ++counted;
  }
  if (counted == 0) return 0.0f;

  // loss_r = logsumexp(logits_r) - logits_r[target]; summed in double over rows, in order.
  const float dscale = dloss / static_cast<float>(counted);
  std::vector<float> e(V);  // exp(z - max) of one row, kept for the gradient
  double loss_sum = 0.0;
  for (size_t r = 0; r < rows; ++r) {
    const int32_t t = targets[r];
    if (t == kIgnoreTarget) continue;
    const float* z = logits.data() + r * V;
    const float zmax = *std::max_element(z, z + V);  // exp never overflows
    float sum = 0.0f;
    for (size_t v = 0; v < V; ++v) {
      e[v] = std::exp(z[v] - zmax);
      sum += e[v];
    }
    loss_sum += static_cast<double>(std::log(sum)) - static_cast<double>(z[t] - zmax);
    if (dlogits.empty()) continue;
    // d loss_r / d z_v = softmax_v - [v == t]; p - 1 is exact for p >= 1/2 (Sterbenz), so a
    // confident row keeps its small gradient's precision.
    const float inv_sum = 1.0f / sum;
    float* dz = dlogits.data() + r * V;
    for (size_t v = 0; v < V; ++v) {
      const float onehot = v == static_cast<size_t>(t) ? 1.0f : 0.0f;
      dz[v] += (e[v] * inv_sum - onehot) * dscale;
    }
  }
  return static_cast<float>(loss_sum / static_cast<double>(counted));
}

}  // namespace zerodp
