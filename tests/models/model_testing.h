// Shared helpers for the model tests: random weights, zeroed gradients, and a whole-model
// finite-difference gradient check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "models/model.h"
#include "tensor/dtype.h"
#include "tensor/gemm.h"

namespace zerodp::model_testing {

using Buffers = std::vector<std::vector<float>>;

inline std::vector<float> normal_vector(size_t n, uint32_t seed, float stddev) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

// Weights away from the initial ones, so that every path carries a gradient of a size
// worth checking: LayerNorm weights 1 + N(0, 0.2^2), everything else N(0, scale^2).
inline Buffers random_weights(const Model& model, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Buffers w;
  for (const auto& unit : model) {
    std::vector<float> flat(unit->numel());
    for (const TensorSpec& t : unit->tensors()) {
      for (size_t i = 0; i < t.numel; ++i) {
        const float n = normal(gen);
        flat[t.offset + i] = t.init == InitKind::kOnes ? 1.0f + 0.2f * n : scale * n;
      }
    }
    w.push_back(std::move(flat));
  }
  return w;
}

inline Buffers zero_grads(const Model& model) {
  Buffers g;
  for (const auto& unit : model) g.emplace_back(unit->numel(), 0.0f);
  return g;
}

// How a finite-difference check may differ from backward: |numeric - analytic| <= atol +
// rtol * |numeric|, with steps eps and eps / 2.
struct Tolerance {
  float eps;
  double atol;
  double rtol;
};

// Every parameter's gradient from backward (with mb.loss_grad_scale = 1) against finite
// differences of the fp32 loss, tensor by tensor.
//
// The numeric derivative is Richardson-extrapolated central differences: D(h) = (f(x + h) -
// f(x - h)) / 2h has error c h^2 + O(h^4), so (4 D(h/2) - D(h)) / 3 cancels the h^2 term.
// Plain central differences are not enough here: through a LayerNorm over few channels the
// loss curves sharply (measured: D(0.01) is 2% off on an embedding, D(0.002) is within the
// fp32 rounding of the loss), and a small h makes that rounding (a few ulps of the loss,
// divided by 2h) the larger error. Steps are measured as stored in float.
inline void expect_model_gradients_match(const Model& model, Buffers& w, MicroBatch mb,
                                         Tolerance tol) {
  mb.loss_grad_scale = 1.0f;
  Buffers g = zero_grads(model);
  model_loss_and_grads(model, w, mb, g);
  const auto loss = [&] { return static_cast<double>(model_loss(model, w, mb)); };
  for (size_t u = 0; u < model.size(); ++u) {
    for (const TensorSpec& t : model[u]->tensors()) {
      double worst = 0.0;
      for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
        float& x = w[u][i];
        const float saved = x;
        const auto central = [&](float h) {
          const float up = saved + h;
          const float down = saved - h;
          x = up;
          const double f_up = loss();
          x = down;
          const double f_down = loss();
          x = saved;
          return (f_up - f_down) / (static_cast<double>(up) - down);
        };
        const double numeric = (4.0 * central(tol.eps / 2) - central(tol.eps)) / 3.0;
        const double err = std::abs(numeric - g[u][i]);
        EXPECT_LE(err, tol.atol + tol.rtol * std::abs(numeric))
            << t.name << "[" << i - t.offset << "]: numeric " << numeric << " analytic " << g[u][i];
        worst = std::max(worst, err);
      }
      ::testing::Test::RecordProperty(t.name + "_max_abs_err", std::to_string(worst));
    }
  }
}

// TensorUse::kProductOperand is a claim about a unit's code: under bf16 products (the engine
// hands each unit its widened weights with their stored bf16 copy, UnitWeights) it
// never reads those tensors' fp32 values, so the engine may leave them unwidened. Forward and
// backward with them poisoned to NaN must give the bits of the same calls with them widened.
// The caller skips unless gemm_bf16_native() (elsewhere the scopes are not consulted).
inline void expect_product_operands_are_read_only_as_bf16(const Model& model, const Buffers& w,
                                                          const MicroBatch& mb) {
  std::vector<std::vector<BFloat16>> stored;
  Buffers widened, poisoned;
  size_t poisoned_count = 0;
  for (size_t u = 0; u < model.size(); ++u) {
    stored.emplace_back(w[u].size());
    convert(std::span<const float>(w[u]), std::span<BFloat16>(stored.back()));
    widened.emplace_back(w[u].size());
    convert(std::span<const BFloat16>(stored.back()), std::span<float>(widened.back()));
    poisoned.push_back(widened.back());
    for (const TensorSpec& t : model[u]->tensors()) {
      if (t.use != TensorUse::kProductOperand) continue;
      std::fill_n(poisoned.back().begin() + static_cast<std::ptrdiff_t>(t.offset), t.numel,
                  std::numeric_limits<float>::quiet_NaN());
      poisoned_count += t.numel;
    }
  }
  ASSERT_GT(poisoned_count, 0u) << "the model declares no product-operand tensor";
  const BatchShape& s = mb.shape;
  const auto pass = [&](const Buffers& weights, Buffers& grads) {
    const size_t n = model.size();
    std::vector<std::vector<float>> acts(n), saved(n), dacts(n);
    size_t scratch_count = 0;
    for (size_t u = 0; u < n; ++u) {
      acts[u].resize(model[u]->output_count(s));
      saved[u].resize(model[u]->saved_count(s, GemmCompute::kBF16));
      dacts[u].assign(model[u]->output_count(s), 0.0f);
      scratch_count = std::max(scratch_count, model[u]->scratch_count(s));
    }
    std::vector<float> scratch(scratch_count);
    const auto input_of = [&](size_t u) {
      return u == 0 ? std::span<const float>() : std::span<const float>(acts[u - 1]);
    };
    const auto weights_of = [&](size_t u) {
      return UnitWeights{
          .values = weights[u], .stored_bf16 = stored[u], .compute = GemmCompute::kBF16};
    };
    for (size_t u = 0; u < n; ++u) {
      model[u]->forward(weights_of(u), input_of(u), acts[u], saved[u], scratch, mb);
    }
    for (size_t u = n; u-- > 0;) {
      std::span<float> din = u == 0 ? std::span<float>() : std::span<float>(dacts[u - 1]);
      model[u]->backward(weights_of(u), input_of(u), saved[u], dacts[u], grads[u], din, scratch,
                         mb);
    }
    return acts.back()[0];
  };
  Buffers g_widened = zero_grads(model), g_poisoned = zero_grads(model);
  const float loss_widened = pass(widened, g_widened);
  const float loss_poisoned = pass(poisoned, g_poisoned);
  ASSERT_TRUE(std::isfinite(loss_widened));
  EXPECT_EQ(std::memcmp(&loss_widened, &loss_poisoned, sizeof(float)), 0)
      << loss_widened << " vs " << loss_poisoned;
  for (size_t u = 0; u < model.size(); ++u) {
    for (size_t i = 0; i < g_widened[u].size(); ++i) {
      ASSERT_EQ(std::memcmp(&g_widened[u][i], &g_poisoned[u][i], sizeof(float)), 0)
          << model[u]->name() << " gradient " << i << ": " << g_widened[u][i] << " vs "
          << g_poisoned[u][i];
    }
  }
}

}  // namespace zerodp::model_testing
