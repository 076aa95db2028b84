#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/core.h>

#include "core/error.h"
#include "optim/adamw_kernel.h"

namespace zerodp {

AdamWCoefficients adamw_coefficients(const AdamWConfig& c, int64_t step, bool decay) {
  const double t = static_cast<double>(step);
  const double bias1 = 1.0 - std::pow(c.beta1, t);
  const double bias2 = 1.0 - std::pow(c.beta2, t);
  return {
      .decay = decay ? static_cast<float>(1.0 - c.lr * c.weight_decay) : 1.0f,
      .beta1 = static_cast<float>(c.beta1),
      .one_minus_b1 = static_cast<float>(1.0 - c.beta1),
      .beta2 = static_cast<float>(c.beta2),
      .one_minus_b2 = static_cast<float>(1.0 - c.beta2),
      .bias2_sqrt = static_cast<float>(std::sqrt(bias2)),
      .neg_step_size = static_cast<float>(-(c.lr / bias1)),
      .eps = static_cast<float>(c.eps),
  };
}

namespace {

void check_field(std::string_view name, double value, bool ok, std::string_view rule) {
  if (!std::isfinite(value) || !ok) {
    throw InvalidArgument(
        fmt::format("adamw: {} = {} is invalid; it must be finite and {}", name, value, rule));
  }
}

void check_step(const AdamWShard& s, int64_t step, float grad_scale) {
  const size_t n = s.master.size();
  if (s.m.size() != n || s.v.size() != n || s.grad.size() != n) {
    throw InvalidArgument(
        fmt::format("adamw: shard spans differ in length: master {}, m {}, v {}, grad {} elements",
                    n, s.m.size(), s.v.size(), s.grad.size()));
  }
  if (step < 1) {
    throw InvalidArgument(
        fmt::format("adamw: step {} is invalid; Adam's step counter is 1-based", step));
  }
  if (!std::isfinite(grad_scale)) {
    throw InvalidArgument(fmt::format(
        "adamw: grad_scale {} is not finite; skip the step on overflow instead", grad_scale));
  }
}

// The element-wise loop. It is compiled twice: portable (fmaf from libm per element) and, on
// x86-64, for CPUs with FMA (vectorized vfmadd). The two differ in speed only; a test compares
// them bit for bit.
[[gnu::always_inline]] inline void update_body(float* p, float* m, float* v, const float* grad,
                                               size_t count, const AdamWCoefficients k,
                                               float grad_scale) {
  for (size_t i = 0; i < count; ++i) adamw_element(p[i], m[i], v[i], grad[i], k, grad_scale);
}

void update_portable(float* p, float* m, float* v, const float* grad, size_t count,
                     const AdamWCoefficients k, float grad_scale) {
  update_body(p, m, v, grad, count, k, grad_scale);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define ZERODP_ADAMW_FMA_PATH 1
[[gnu::target("fma")]] void update_fma(float* p, float* m, float* v, const float* grad,
                                       size_t count, const AdamWCoefficients k, float grad_scale) {
  update_body(p, m, v, grad, count, k, grad_scale);
}
#endif

void update_range(float* p, float* m, float* v, const float* grad, size_t count,
                  const AdamWCoefficients k, float grad_scale) {
#ifdef ZERODP_ADAMW_FMA_PATH
  static const bool has_fma = __builtin_cpu_supports("fma");
  if (has_fma) return update_fma(p, m, v, grad, count, k, grad_scale);
#endif
  update_portable(p, m, v, grad, count, k, grad_scale);
}

}  // namespace

void validate(const AdamWConfig& c) {
  check_field("lr", c.lr, c.lr >= 0, ">= 0");
  check_field("beta1", c.beta1, c.beta1 >= 0 && c.beta1 < 1, "in [0, 1)");
  check_field("beta2", c.beta2, c.beta2 >= 0 && c.beta2 < 1, "in [0, 1)");
  check_field("eps", c.eps, c.eps > 0, "> 0");
  check_field("weight_decay", c.weight_decay, c.weight_decay >= 0, ">= 0");
}

void adamw_update(const AdamWShard& s, bool decay, const AdamWConfig& config, int64_t step,
                  float grad_scale) {
  validate(config);
  check_step(s, step, grad_scale);
  update_range(s.master.data(), s.m.data(), s.v.data(), s.grad.data(), s.master.size(),
               adamw_coefficients(config, step, decay), grad_scale);
}

std::string_view adamw_kernel_path() {
#ifdef ZERODP_ADAMW_FMA_PATH
  if (__builtin_cpu_supports("fma")) return "fma";
#endif
  return "portable";
}

namespace portable {

void adamw_update(const AdamWShard& s, bool decay, const AdamWConfig& config, int64_t step,
                  float grad_scale) {
  validate(config);
  check_step(s, step, grad_scale);
  update_portable(s.master.data(), s.m.data(), s.v.data(), s.grad.data(), s.master.size(),
                  adamw_coefficients(config, step, decay), grad_scale);
}

}  // namespace portable

void adamw_step(const AdamWShard& s, std::span<const Range> decay_ranges, const AdamWConfig& config,
                int64_t step, float grad_scale) {
  validate(config);
  check_step(s, step, grad_scale);
  for (size_t r = 0; r < decay_ranges.size(); ++r) {
    const Range& d = decay_ranges[r];
    if (d.begin > d.end || (r > 0 && d.begin < decay_ranges[r - 1].end)) {
      throw InvalidArgument(fmt::format(
          "adamw: decay range {} [{}, {}) is {}; ranges must be sorted and non-overlapping", r,
          d.begin, d.end, d.begin > d.end ? "reversed" : "before the end of the previous one"));
    }
  }
  const AdamWCoefficients with_decay = adamw_coefficients(config, step, true);
  const AdamWCoefficients without_decay = adamw_coefficients(config, step, false);
  const size_t begin = s.offset;
  const size_t end = s.offset + s.master.size();
  // Walk the shard in pieces that are wholly inside or wholly outside a decay range.
  auto run = [&](size_t from, size_t to, const AdamWCoefficients& k) {
    if (from >= to) return;
    const size_t j = from - begin;
    update_range(s.master.data() + j, s.m.data() + j, s.v.data() + j, s.grad.data() + j, to - from,
                 k, grad_scale);
  };
  size_t next = begin;  // first flat index not yet updated
  for (const Range& d : decay_ranges) {
    if (d.end <= next) continue;
    if (d.begin >= end) break;
    const size_t lo = std::max(d.begin, next);
    const size_t hi = std::min(d.end, end);
    run(next, lo, without_decay);
    run(lo, hi, with_decay);
    next = hi;
  }
  run(next, end, without_decay);
}

}  // namespace zerodp
