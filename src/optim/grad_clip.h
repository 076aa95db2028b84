// Gradient clipping by global norm, in the pieces ZeRO needs: each rank sums the squares of
// its partition range, the caller reduces those sums in rank order (Σ_r, as a control
// collective), and every rank derives the same clip coefficient from the same global sum.
//
// Precision and order: squares are summed in double. The square of an fp32 value is exact
// in double (24-bit significand squared fits in 53 bits), so only the additions round, and
// the result is far less sensitive to the partition than an fp32 sum. The order is fixed
// by the span alone: 16 lanes, lane k summing elements 16*b + k for b = 0, 1, ... in order;
// the lanes are folded pairwise (k += k + 8, then k += k + 4, k += k + 2, k += k + 1); the
// tail past the last full block of 16 is then added in order. No threads, no dependence on
// addresses: the same span contents give the same bits.
#pragma once

#include <span>

namespace zerodp {

// Σ x[i]^2 in double, in the order above. 0 for an empty span. Non-finite inputs give a
// non-finite sum.
double sum_of_squares(std::span<const float> x);

// sqrt(global_sum_of_squares): the L2 norm of all gradients.
double grad_norm(double global_sum_of_squares);

// The factor every gradient is multiplied by, as torch.nn.utils.clip_grad_norm_ (1.13):
// min(1, max_norm / (grad_norm + 1e-6)). `max_norm` 0 turns clipping off (returns 1).
// zerodp computes it in double and rounds once to fp32; PyTorch computes it in the
// gradients' dtype (fp32: reciprocal(norm + 1e-6) * max_norm), which can differ by an ulp.
// A NaN norm gives NaN and an infinite norm gives 0 (as PyTorch, error_if_nonfinite=False);
// fp16 runs skip such steps before clipping. Throws InvalidArgument if max_norm is negative
// or not finite.
float clip_coefficient(double grad_norm, double max_norm);

}  // namespace zerodp
