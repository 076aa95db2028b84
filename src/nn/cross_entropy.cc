// Softmax cross-entropy, forward and backward in one pass over the logits.
#include "nn/layers.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "nn/check.h"
#include "nn/vecmath.h"

namespace zerodp {

using nn_detail::check_count;
using nn_detail::check_optional_count;
using nn_detail::exp_nonpositive;
using nn_detail::max_of;
using nn_detail::sum_exp_shifted;

namespace {

// One row's loss; adds its gradient into dz unless dz is null. The exponentials are computed
// twice (for the sum, then for the gradient) rather than kept in a buffer: the same function
// of the same inputs, so the same bits, and nothing to allocate.
ZERODP_NN_CLONES double row_loss(float* __restrict dz, const float* __restrict z, size_t t,
                                 size_t V, float dscale) {
  const float zmax = max_of(z, V);  // exp never overflows
  const float sum = sum_exp_shifted(nullptr, z, zmax, V);
  const double loss = static_cast<double>(std::log(sum)) - static_cast<double>(z[t] - zmax);
  if (dz == nullptr) return loss;
  // d loss_r / d z_v = softmax_v - [v == t]; p - 1 is exact for p >= 1/2 (Sterbenz), so a
  // confident row keeps its small gradient's precision.
  const float inv_sum = 1.0f / sum;
  for (size_t v = 0; v < V; ++v) {
    const float onehot = v == t ? 1.0f : 0.0f;
    dz[v] += (exp_nonpositive(z[v] - zmax) * inv_sum - onehot) * dscale;
  }
  return loss;
}

}  // namespace

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
  double loss_sum = 0.0;
  for (size_t r = 0; r < rows; ++r) {
    const int32_t t = targets[r];
    if (t == kIgnoreTarget) continue;
    const float* z = logits.data() + r * V;
    loss_sum += row_loss(dlogits.empty() ? nullptr : dlogits.data() + r * V, z,
                         static_cast<size_t>(t), V, dscale);
  }
  return static_cast<float>(loss_sum / static_cast<double>(counted));
}

}  // namespace zerodp
