// Residual connection: out = inp1 + inp2; both inputs receive dout.
#include "nn/layers.h"

#include <string>

#include <fmt/format.h>

#include "nn/check.h"

namespace zerodp {

using nn_detail::check_count;

void residual_forward(std::span<float> out, std::span<const float> inp1,
                      std::span<const float> inp2) {
  const std::string shape = fmt::format("(count={})", out.size());
  check_count("residual_forward", "inp1", inp1, out.size(), shape);
  check_count("residual_forward", "inp2", inp2, out.size(), shape);
  for (size_t i = 0; i < out.size(); ++i) out[i] = inp1[i] + inp2[i];
}

void residual_backward(std::span<float> dinp1, std::span<float> dinp2,
                       std::span<const float> dout) {
  const std::string shape = fmt::format("(count={})", dout.size());
  check_count("residual_backward", "dinp1", dinp1, dout.size(), shape);
  check_count("residual_backward", "dinp2", dinp2, dout.size(), shape);
  for (size_t i = 0; i < dout.size(); ++i) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

}  // namespace zerodp
