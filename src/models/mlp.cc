// The mlp units: Linear + GELU per hidden layer, then Linear + cross-entropy.
#include "models/mlp.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "models/unit_base.h"
#include "nn/layers.h"

namespace zerodp {

using models_detail::ParamUnit;
using models_detail::Slot;

namespace {

float lecun_std(int fan_in) { return static_cast<float>(1.0 / std::sqrt(double(fan_in))); }

// A Linear layer whose input is the micro-batch's features (the first unit) or the previous
// unit's activation (B, in).
class MlpUnit : public ParamUnit {
 protected:
  MlpUnit(std::string name, int in, int out, bool reads_features)
      : ParamUnit(std::move(name)),
        in_(static_cast<size_t>(in)),
        out_(static_cast<size_t>(out)),
        reads_features_(reads_features) {
    const std::string p = this->name() + ".";
    weight_ = param(p + "weight", {out, in}, InitKind::kNormal, lecun_std(in), true,
                    TensorUse::kProductOperand);
    bias_ = param(p + "bias", {out}, InitKind::kZeros, 0.0f, false);
  }

  static size_t batch(const BatchShape& s) { return static_cast<size_t>(s.B); }

  void check_batch(std::string_view fn, const BatchShape& s) const {
    if (s.B < 1 || s.T != 1) {
      throw InvalidArgument(
          fmt::format("unit {} {}: micro-batch (B={}, T={}) does not fit; need B >= 1 and T = 1",
                      name(), fn, s.B, s.T));
    }
  }

  // The layer's input: mb.features for the first unit (not an activation, so not covered by
  // Unit's length contract), `in` otherwise.
  std::span<const float> layer_input(std::string_view fn, std::span<const float> in,
                                     const MicroBatch& mb) const {
    if (!reads_features_) return in;
    const BatchShape& s = mb.shape;
    check_exact(fn, "mb.features", mb.features.size(), batch(s) * in_, s);
    return mb.features;
  }

 public:
  size_t input_count(const BatchShape& s) const override {
    return reads_features_ ? 0 : batch(s) * in_;
  }
  // The input gradient only past the first unit: the features need none.
  std::vector<GemmShape> products(const BatchShape& s) const override {
    return linear_products(batch(s), in_, out_, !reads_features_);
  }

 protected:
  size_t in_, out_;
  bool reads_features_;
  Slot weight_, bias_;
};

class HiddenUnit final : public MlpUnit {
 public:
  HiddenUnit(int index, int in, int out)
      : MlpUnit(fmt::format("layers.{}", index), in, out, index == 0) {}

  size_t output_count(const BatchShape& s) const override { return batch(s) * out_; }
  // The pre-activation (B, out), GELU's input.
  size_t saved_count(const BatchShape& s, GemmCompute) const override { return batch(s) * out_; }
  // Backward: d(pre-activation) (B, out).
  size_t scratch_count(const BatchShape& s) const override { return batch(s) * out_; }

 private:
  void do_forward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                  std::span<float> out, std::span<float> saved, std::span<float>,
                  const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("forward", s);
    const auto x = layer_input("forward", in, mb);
    linear_forward(saved, x, weight_.of(w), bias_.of(w), batch(s), in_, out_, compute);
    gelu_forward(out, saved);
  }

  void do_backward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                   std::span<const float> saved, std::span<const float> dout, std::span<float> dw,
                   std::span<float> din, std::span<float> scratch, const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("backward", s);
    const auto x = layer_input("backward", in, mb);
    const auto dpre = scratch.first(batch(s) * out_);
    std::fill(dpre.begin(), dpre.end(), 0.0f);
    gelu_backward(dpre, saved, dout);
    linear_backward(din, weight_.of(dw), bias_.of(dw), dpre, x, weight_.of(w), batch(s), in_, out_,
                    compute);
  }
};

class ClassifierHead final : public MlpUnit {
 public:
  ClassifierHead(int in, int classes, bool reads_features)
      : MlpUnit("head", in, classes, reads_features) {}

  size_t output_count(const BatchShape&) const override { return 1; }
  // The logits (B, classes).
  size_t saved_count(const BatchShape& s, GemmCompute) const override { return batch(s) * out_; }
  // Backward: d(logits) (B, classes).
  size_t scratch_count(const BatchShape& s) const override { return batch(s) * out_; }

 private:
  void do_forward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                  std::span<float> out, std::span<float> saved, std::span<float>,
                  const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("forward", s);
    const auto x = layer_input("forward", in, mb);
    linear_forward(saved, x, weight_.of(w), bias_.of(w), batch(s), in_, out_, compute);
    out[0] = cross_entropy_forward_backward({}, saved, mb.targets, batch(s), out_);
  }

  void do_backward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                   std::span<const float> saved, std::span<const float>, std::span<float> dw,
                   std::span<float> din, std::span<float> scratch, const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("backward", s);
    const auto x = layer_input("backward", in, mb);
    const auto dlogits = scratch.first(batch(s) * out_);
    std::fill(dlogits.begin(), dlogits.end(), 0.0f);
    cross_entropy_forward_backward(dlogits, saved, mb.targets, batch(s), out_, mb.loss_grad_scale);
    linear_backward(din, weight_.of(dw), bias_.of(dw), dlogits, x, weight_.of(w), batch(s), in_,
                    out_, compute);
  }
};

}  // namespace

void validate(const MlpConfig& config) {
  const auto at_least = [](std::string_view field, int value, int least) {
    if (value < least) {
      throw InvalidArgument(
          fmt::format("mlp: {} is {}; it must be at least {}", field, value, least));
    }
  };
  at_least("inputs", config.inputs, 1);
  at_least("hidden_layers", config.hidden_layers, 0);
  at_least("classes", config.classes, 1);
  if (config.hidden_layers > 0) at_least("hidden", config.hidden, 1);
}

Model make_mlp(const MlpConfig& config) {
  validate(config);
  Model model;
  int in = config.inputs;
  for (int i = 0; i < config.hidden_layers; ++i) {
    model.push_back(std::make_unique<HiddenUnit>(i, in, config.hidden));
    in = config.hidden;
  }
  model.push_back(std::make_unique<ClassifierHead>(in, config.classes, config.hidden_layers == 0));
  return model;
}

}  // namespace zerodp
