// Defines a small classifier from zerodp's layers as two units and trains it with the
// engine at ZeRO stage 3 on 4 local ranks. Each unit owns one flat parameter buffer; its
// tensors are views into it, so the engine can shard, gather and update it without knowing
// what the layers are. A unit implements do_forward/do_backward: Unit::forward/backward
// check every buffer's length against the counts below before calling them, and pass the
// GemmCompute the run chose, which the unit hands to each layer that multiplies.
#include <cstdio>

#include "models/unit.h"
#include "nn/layers.h"
#include "train/engine.h"

namespace {

using zerodp::BatchShape;
using zerodp::GemmCompute;
using zerodp::InitKind;
using zerodp::MicroBatch;

constexpr size_t kPixels = 784, kHidden = 64, kClasses = 10;

size_t rows(const BatchShape& s) { return static_cast<size_t>(s.B) * static_cast<size_t>(s.T); }

// pixels (B, 784) -> GELU(Linear) (B, 64)
class Hidden : public zerodp::Unit {
 public:
  Hidden() : Unit("hidden") {
    add_tensor("hidden.weight", {kHidden, kPixels}, InitKind::kNormal, 0.036f, true);
    add_tensor("hidden.bias", {kHidden}, InitKind::kZeros, 0.0f, false);
  }
  size_t input_count(const BatchShape&) const override { return 0; }  // reads mb.features
  size_t output_count(const BatchShape& s) const override { return rows(s) * kHidden; }
  size_t saved_count(const BatchShape& s, GemmCompute) const override { return rows(s) * kHidden; }
  size_t scratch_count(const BatchShape& s) const override { return rows(s) * kHidden; }

  void do_forward(std::span<const float> w, GemmCompute compute, std::span<const float>,
                  std::span<float> out, std::span<float> saved, std::span<float>,
                  const MicroBatch& mb) override {
    const size_t n = rows(mb.shape);
    zerodp::linear_forward(saved, mb.features, w.first(kHidden * kPixels),
                           w.subspan(kHidden * kPixels, kHidden), n, kPixels, kHidden, compute);
    zerodp::gelu_forward(out, saved);
  }
  void do_backward(std::span<const float> w, GemmCompute compute, std::span<const float>,
                   std::span<const float> saved, std::span<const float> dout, std::span<float> dw,
                   std::span<float>, std::span<float> scratch, const MicroBatch& mb) override {
    const size_t n = rows(mb.shape);
    std::span<float> dpre = scratch.first(n * kHidden);
    std::fill(dpre.begin(), dpre.end(), 0.0f);
    zerodp::gelu_backward(dpre, saved, dout);
    zerodp::linear_backward({}, dw.first(kHidden * kPixels), dw.subspan(kHidden * kPixels, kHidden),
                            dpre, mb.features, w.first(kHidden * kPixels), n, kPixels, kHidden,
                            compute);
  }
};

// (B, 64) -> Linear -> softmax cross-entropy: the mean loss
class Head : public zerodp::Unit {
 public:
  Head() : Unit("head") {
    add_tensor("head.weight", {kClasses, kHidden}, InitKind::kNormal, 0.125f, true);
    add_tensor("head.bias", {kClasses}, InitKind::kZeros, 0.0f, false);
  }
  size_t input_count(const BatchShape& s) const override { return rows(s) * kHidden; }
  size_t output_count(const BatchShape&) const override { return 1; }
  size_t saved_count(const BatchShape& s, GemmCompute) const override { return rows(s) * kClasses; }
  size_t scratch_count(const BatchShape& s) const override { return rows(s) * kClasses; }

  void do_forward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                  std::span<float> out, std::span<float> saved, std::span<float>,
                  const MicroBatch& mb) override {
    const size_t n = rows(mb.shape);
    zerodp::linear_forward(saved, in, w.first(kClasses * kHidden),
                           w.subspan(kClasses * kHidden, kClasses), n, kHidden, kClasses, compute);
    out[0] = zerodp::cross_entropy_forward_backward({}, saved, mb.targets, n, kClasses);
  }
  void do_backward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                   std::span<const float> saved, std::span<const float>, std::span<float> dw,
                   std::span<float> din, std::span<float> scratch, const MicroBatch& mb) override {
    const size_t n = rows(mb.shape);
    std::span<float> dlogits = scratch.first(n * kClasses);
    std::fill(dlogits.begin(), dlogits.end(), 0.0f);
    (void)zerodp::cross_entropy_forward_backward(dlogits, saved, mb.targets, n, kClasses,
                                                 mb.loss_grad_scale);
    zerodp::linear_backward(din, dw.first(kClasses * kHidden),
                            dw.subspan(kClasses * kHidden, kClasses), dlogits, in,
                            w.first(kClasses * kHidden), n, kHidden, kClasses, compute);
  }
};

}  // namespace

int main(int argc, char** argv) {
  zerodp::TrainConfig config;
  config.model = "custom-images";  // the engine feeds image rows; the factory builds the model
  config.data = argc > 1 ? argv[1] : "synthetic";
  config.launch.ranks = 4;
  config.stage = 3;
  config.micro_batch = 16;
  config.steps = 60;
  config.lr = 3e-3f;
  auto make_model = [] {
    zerodp::Model m;
    m.push_back(std::make_unique<Hidden>());
    m.push_back(std::make_unique<Head>());
    return m;
  };
  const zerodp::TrainResult r = zerodp::train(config, argc, argv, {}, make_model);
  std::printf("custom model: %llu parameters, stage %d on %d ranks: loss %.4f -> %.4f\n",
              static_cast<unsigned long long>(r.params), config.stage, r.world_size,
              r.steps.front().loss, r.steps.back().loss);
  return r.steps.back().loss < r.steps.front().loss ? 0 : 1;
}
