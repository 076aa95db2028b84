// Encoder: token embedding plus learned position embedding.
#include "nn/layers.h"

#include <string>

#include <fmt/format.h>

#include "nn/check.h"

namespace zerodp {

using nn_detail::check_count;

namespace {

void check_encoder(std::string_view fn, std::span<const int32_t> tokens, size_t wpe_count, size_t B,
                   size_t T, size_t C, size_t V) {
  const std::string shape = fmt::format("(B={}, T={}, C={}, V={})", B, T, C, V);
  check_count(fn, "tokens", tokens, B * T, shape);
  if (C == 0 || wpe_count % C != 0 || wpe_count / C < T) {
    throw InvalidArgument(fmt::format(
        "{}: wpe holds {} elements, not (maxT, C={}) with maxT >= T={}; the position table "
        "must have at least T rows of C",
        fn, wpe_count, C, T));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || static_cast<size_t>(tokens[i]) >= V) {
      throw InvalidArgument(fmt::format("{}: token {} at (b={}, t={}) is outside [0, V={})", fn,
                                        tokens[i], i / T, i % T, V));
    }
  }
}

}  // namespace

void encoder_forward(std::span<float> out, std::span<const int32_t> tokens,
                     std::span<const float> wte, std::span<const float> wpe, size_t B, size_t T,
                     size_t C, size_t V) {
  const std::string shape = fmt::format("(B={}, T={}, C={}, V={})", B, T, C, V);
  check_count("encoder_forward", "out", out, B * T * C, shape);
  check_count("encoder_forward", "wte", wte, V * C, shape);
  check_encoder("encoder_forward", tokens, wpe.size(), B, T, C, V);
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      float* out_bt = out.data() + (b * T + t) * C;
      const float* wte_ix = wte.data() + static_cast<size_t>(tokens[b * T + t]) * C;
      const float* wpe_t = wpe.data() + t * C;
      for (size_t i = 0; i < C; ++i) out_bt[i] = wte_ix[i] + wpe_t[i];
    }
  }
}

void encoder_backward(std::span<float> dwte, std::span<float> dwpe, std::span<const float> dout,
                      std::span<const int32_t> tokens, size_t B, size_t T, size_t C, size_t V) {
  const std::string shape = fmt::format("(B={}, T={}, C={}, V={})", B, T, C, V);
  check_count("encoder_backward", "dwte", dwte, V * C, shape);
  check_count("encoder_backward", "dout", dout, B * T * C, shape);
  check_encoder("encoder_backward", tokens, dwpe.size(), B, T, C, V);
  // Positions in (b, t) order: a token seen twice accumulates in that order, every run.
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      const float* dout_bt = dout.data() + (b * T + t) * C;
      float* dwte_ix = dwte.data() + static_cast<size_t>(tokens[b * T + t]) * C;
      float* dwpe_t = dwpe.data() + t * C;
      for (size_t i = 0; i < C; ++i) {
        dwte_ix[i] += dout_bt[i];
        dwpe_t[i] += dout_bt[i];
      }
    }
  }
}

}  // namespace zerodp
