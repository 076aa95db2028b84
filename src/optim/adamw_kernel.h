// The AdamW element update shared by the fp32 kernel (adamw.cc) and the 8-bit-moment kernel
// (moments8.cc), so that both compute the formula adamw.h states with the same operations.
#pragma once

#include <cmath>
#include <cstdint>

#include "optim/adamw.h"

namespace zerodp {

// The step's fp32 coefficients, each computed in double and rounded once (see adamw.h).
struct AdamWCoefficients {
  float decay;          // fp32(1 - lr * weight_decay), or 1 for elements that do not decay
  float beta1;          // fp32(beta1)
  float one_minus_b1;   // fp32(1 - beta1)
  float beta2;          // fp32(beta2)
  float one_minus_b2;   // fp32(1 - beta2)
  float bias2_sqrt;     // fp32(sqrt(1 - beta2^t))
  float neg_step_size;  // fp32(-(lr / (1 - beta1^t)))
  float eps;            // fp32(eps)
};

// Neither validates: callers check `config` and `step` once per call of the public API.
AdamWCoefficients adamw_coefficients(const AdamWConfig& config, int64_t step, bool decay);

// One element, branch-free so that the loops around it vectorize. With -ffp-contract=off every
// operation is the one written, rounded once; the two moment updates are explicit fused
// multiply-adds, correctly rounded in hardware or in libm. `k` is taken by value: a reference
// might alias the outputs, and clang then keeps the loop scalar.
[[gnu::always_inline]] inline void adamw_element(float& p, float& m, float& v, float grad,
                                                 const AdamWCoefficients k, float grad_scale) {
  const float g = grad * grad_scale;
  const float decayed = p * k.decay;
  const float mi = std::fma(k.one_minus_b1, g, m * k.beta1);
  const float vi = std::fma(k.one_minus_b2 * g, g, v * k.beta2);
  const float denom = std::sqrt(vi) / k.bias2_sqrt + k.eps;
  p = decayed + (k.neg_step_size * mi) / denom;
  m = mi;
  v = vi;
}

}  // namespace zerodp
