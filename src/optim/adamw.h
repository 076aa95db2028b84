// AdamW on an fp32 shard: the optimizer every ZeRO stage runs on its own range of a flat buffer.
//
// The update is element-wise: the new master[i], m[i], v[i] depend only on master[i], m[i],
// v[i], grad[i] and the step's scalars. So a rank can step any contiguous range (its
// Partition range), and the result does not depend on how a buffer is split into calls, on
// where a range starts, on the thread count or on buffer addresses. The project builds with
// -ffp-contract=off, and every operation below is one IEEE-754 fp32 operation rounded once,
// so vector and scalar code give the same bits.
//
// Formula and order: PyTorch 1.13 torch.optim.AdamW, `_single_tensor_adamw` (non-foreach,
// non-fused, amsgrad=False, maximize=False), as its AVX2 and AVX-512 CPU kernels compute
// it. Hyperparameters are doubles, as PyTorch's Python floats are; each derived coefficient
// is computed in double and rounded to fp32 once, as PyTorch does when it hands a Python
// scalar to an fp32 kernel:
//
//   wd    = fp32(1 - lr * weight_decay)       (1 where the element does not decay)
//   b1    = fp32(beta1),  c1 = fp32(1 - beta1)
//   b2    = fp32(beta2),  c2 = fp32(1 - beta2)
//   s2    = fp32(sqrt(1 - beta2^t))           t = step, 1-based
//   alpha = fp32(-(lr / (1 - beta1^t)))
//   e     = fp32(eps)
// then per element in fp32, each operation rounded once; fma(a, b, c) = a*b + c rounded once:
//   g = grad * grad_scale                     zerodp's: unscale and clip in one multiply
//   p = p * wd                                param.mul_(1 - lr * wd)
//   m = fma(c1, g, m * b1)                    exp_avg.mul_(b1).add_(grad, alpha=1 - b1)
//   v = fma(c2 * g, g, v * b2)                exp_avg_sq.mul_(b2).addcmul_(grad, grad, 1 - b2)
//   p = p + (alpha * m) / (sqrt(v) / s2 + e)  param.addcdiv_(exp_avg, denom, -step_size)
//
// The two fused multiply-adds are what PyTorch's vectorized `add_(x, alpha)` (vec::fmadd)
// and GCC's contraction of its AVX2 `addcmul_` give; they are explicit std::fma here, which
// is correctly rounded everywhere, so -ffp-contract=off does not change them. With
// grad_scale 1 the result equals torch 1.13.1 (Debian, AVX2 or AVX-512 capability) bit for
// bit (tested against literals it printed). PyTorch's own `default` capability (no FMA)
// rounds the two products separately and so differs from itself by an ulp in m and v.
// Elements that do not decay skip the multiply by wd (PyTorch multiplies by 1 - lr * 0 = 1:
// the same bits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/partition.h"

namespace zerodp {

// Plain hyperparameters; defaults are the PyTorch peer's (shared/peers/torch/train_ref.py:
// lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1). `lr` is this step's learning rate
// (the engine sets it from LrSchedule::lr_at each step).
struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// Throws InvalidArgument naming the field and value unless: lr >= 0, 0 <= beta1 < 1,
// 0 <= beta2 < 1, eps > 0, weight_decay >= 0, all finite.
void validate(const AdamWConfig& config);

// One rank's slice of a flat buffer's optimizer state. All spans hold the same count.
struct AdamWShard {
  std::span<float> master;      // (count,) fp32 master weights, updated in place
  std::span<float> m;           // (count,) first moment (exp_avg), updated in place
  std::span<float> v;           // (count,) second moment (exp_avg_sq), updated in place
  std::span<const float> grad;  // (count,) gradient as reduced (loss-scaled, unclipped)
  size_t offset = 0;            // flat-buffer index of element 0 (Partition::offset(rank))
};

// One AdamW step on `shard`. Element j is flat-buffer element shard.offset + j; it takes
// weight decay iff a range in `decay_ranges` holds that index. `decay_ranges` are in
// flat-buffer coordinates, sorted and non-overlapping, built once from the tensor specs
// (which tensors decay); they may extend past the shard (only the overlap is used).
// `step` is Adam's 1-based step counter for bias correction (skipped fp16 steps do not
// count). `grad_scale` multiplies every gradient first: 1/loss_scale times the clip
// coefficient. Throws InvalidArgument on mismatched span sizes, step < 1, a non-finite
// grad_scale, unsorted or overlapping ranges, or an invalid config.
void adamw_step(const AdamWShard& shard, std::span<const Range> decay_ranges,
                const AdamWConfig& config, int64_t step, float grad_scale);

// The kernel adamw_step runs on each piece: the same step on every element of `shard`,
// with decay on or off for all of them. `shard.offset` is ignored.
void adamw_update(const AdamWShard& shard, bool decay, const AdamWConfig& config, int64_t step,
                  float grad_scale);

// The kernel path adamw_update runs on this CPU: "fma" (x86-64 with FMA: vectorized fused
// multiply-adds) or "portable" (fmaf from libm per element). Both give the same bits.
std::string_view adamw_kernel_path();

// The portable path, exposed so tests can compare it with the dispatched one bit for bit.
namespace portable {
void adamw_update(const AdamWShard& shard, bool decay, const AdamWConfig& config, int64_t step,
                  float grad_scale);
}  // namespace portable

}  // namespace zerodp
