#include "models/model.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace zerodp {

size_t parameter_count(const Model& model) {
  size_t total = 0;
  for (const auto& unit : model) total += unit->numel();
  return total;
}

std::vector<GemmShape> model_products(const Model& model, const BatchShape& s) {
  std::vector<GemmShape> all;
  for (const auto& unit : model) {
    const std::vector<GemmShape> p = unit->products(s);
    all.insert(all.end(), p.begin(), p.end());
  }
  return distinct_shapes(std::move(all));
}

float model_loss_and_grads(const Model& model, std::span<const std::vector<float>> weights,
                           const MicroBatch& mb, std::span<std::vector<float>> grads) {
  const size_t n = model.size();
  const bool backward = !grads.empty();
  if (n == 0 || weights.size() != n || (backward && grads.size() != n)) {
    throw InvalidArgument(fmt::format(
        "model_loss_and_grads: the model has {} units; got {} weight buffers and {} gradient "
        "buffers (need one weight buffer per unit, and one gradient buffer per unit or none)",
        n, weights.size(), grads.size()));
  }
  for (size_t u = 0; u < n; ++u) {
    const size_t numel = model[u]->numel();
    if (weights[u].size() != numel || (backward && grads[u].size() != numel)) {
      throw InvalidArgument(fmt::format(
          "model_loss_and_grads: unit {} has {} parameters; its weights hold {} and its "
          "gradients {}",
          model[u]->name(), numel, weights[u].size(), backward ? grads[u].size() : numel));
    }
  }
  const BatchShape& s = mb.shape;
  if (model.back()->output_count(s) != 1) {
    throw InvalidArgument(
        fmt::format("model_loss_and_grads: the last unit {} outputs {} elements, not a loss (1)",
                    model.back()->name(), model.back()->output_count(s)));
  }

  // acts[u] is unit u's output; unit u reads acts[u - 1] (the first unit reads nothing).
  std::vector<std::vector<float>> acts(n), saved(n);
  size_t scratch_count = 0;
  for (size_t u = 0; u < n; ++u) {
    acts[u].resize(model[u]->output_count(s));
    saved[u].resize(model[u]->saved_count(s, GemmCompute::kFP32));
    scratch_count = std::max(scratch_count, model[u]->scratch_count(s));
  }
  std::vector<float> scratch(scratch_count);
  const auto input_of = [&](size_t u) -> std::span<const float> {
    return u == 0 ? std::span<const float>() : std::span<const float>(acts[u - 1]);
  };
  // The reference multiplies in fp32, whatever precision a run it checks trains in.
  const auto weights_of = [&](size_t u) { return UnitWeights::fp32(weights[u]); };
  for (size_t u = 0; u < n; ++u) {
    model[u]->forward(weights_of(u), input_of(u), acts[u], saved[u], scratch, mb);
  }
  const float loss = acts.back()[0];
  if (!backward) return loss;

  // dacts[u] is d(loss)/d(acts[u]); the head's is unused (it starts from loss_grad_scale).
  std::vector<std::vector<float>> dacts(n);
  for (size_t u = 0; u < n; ++u) dacts[u].assign(model[u]->output_count(s), 0.0f);
  for (size_t u = n; u-- > 0;) {
    std::span<float> din = u == 0 ? std::span<float>() : std::span<float>(dacts[u - 1]);
    model[u]->backward(weights_of(u), input_of(u), saved[u], dacts[u], grads[u], din, scratch, mb);
  }
  return loss;
}

}  // namespace zerodp
