// Finite-difference gradient checks for the nn layer tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace zerodp::gradcheck {

inline std::vector<float> normal_vector(size_t n, uint32_t seed, float stddev = 1.0f,
                                        float mean = 0.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// sum_i w_i * y_i in double: the scalar objective whose gradient w.r.t. y is w, so a layer's
// backward called with dout = w must give the gradient of this w.r.t. every input.
inline double weighted_sum(std::span<const float> y, std::span<const float> w) {
  double s = 0.0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * w[i];
  return s;
}

struct Tolerance {
  float eps;    // the finite-difference step
  double atol;  // |numeric - analytic| <= atol + rtol * |numeric|
  double rtol;
};

// Compares analytic[i] with the central difference of objective() in x[i], for every i (or every
// `every`-th, where the objective is dear).
// The step actually taken is measured in float ((x + eps) - (x - eps) as stored), so the
// rounding of x +- eps does not enter the quotient. x is restored after each element.
inline void expect_gradient_matches(const std::string& name, std::span<float> x,
                                    std::span<const float> analytic,
                                    const std::function<double()>& objective, Tolerance tol,
                                    size_t every = 1) {
  ASSERT_EQ(x.size(), analytic.size()) << name;
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); i += every) {
    const float saved = x[i];
    const float up = saved + tol.eps;
    const float down = saved - tol.eps;
    x[i] = up;
    const double f_up = objective();
    x[i] = down;
    const double f_down = objective();
    x[i] = saved;
    const double numeric = (f_up - f_down) / (static_cast<double>(up) - down);
    const double err = std::abs(numeric - analytic[i]);
    const double allowed = tol.atol + tol.rtol * std::abs(numeric);
    EXPECT_LE(err, allowed) << name << "[" << i << "]: numeric " << numeric << " analytic "
                            << analytic[i];
    worst = std::max(worst, err);
  }
  // Visible in the XML report (--gtest_output=xml), to see how much margin a tolerance has.
  ::testing::Test::RecordProperty(name + "_max_abs_err", std::to_string(worst));
}

}  // namespace zerodp::gradcheck
