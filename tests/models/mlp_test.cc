// The mlp model: parameter count, layout and policy, whole-model gradients.
#include "models/mlp.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "model_testing.h"
#include "models/model.h"

namespace zerodp {
namespace {

using model_testing::Buffers;
using model_testing::random_weights;
using model_testing::zero_grads;

// 784*256 + 256 + 256*256 + 256 + 256*10 + 10.
TEST(MlpParams, DefaultIs269322) { EXPECT_EQ(parameter_count(make_mlp({})), 269322u); }

TEST(MlpLayout, UnitsTensorsAndPolicy) {
  const Model m = make_mlp({});
  ASSERT_EQ(m.size(), 3u);
  const char* units[] = {"layers.0", "layers.1", "head"};
  const std::vector<int64_t> shapes[] = {{256, 784}, {256, 256}, {10, 256}};
  for (size_t u = 0; u < 3; ++u) {
    EXPECT_EQ(m[u]->name(), units[u]);
    ASSERT_EQ(m[u]->tensors().size(), 2u);
    const TensorSpec& weight = m[u]->tensors()[0];
    const TensorSpec& bias = m[u]->tensors()[1];
    EXPECT_EQ(weight.name, std::string(units[u]) + ".weight");
    EXPECT_EQ(bias.name, std::string(units[u]) + ".bias");
    EXPECT_EQ(weight.shape, shapes[u]);
    EXPECT_EQ(bias.shape, std::vector<int64_t>{shapes[u][0]});
    EXPECT_EQ(weight.offset, 0u);
    EXPECT_EQ(bias.offset, weight.numel);
    EXPECT_EQ(m[u]->numel(), weight.numel + bias.numel);
    EXPECT_TRUE(weight.weight_decay);
    EXPECT_FALSE(bias.weight_decay);
    EXPECT_EQ(weight.init, InitKind::kNormal);
    EXPECT_FLOAT_EQ(weight.init_std, 1.0f / std::sqrt(static_cast<float>(shapes[u][1])));
    EXPECT_EQ(bias.init, InitKind::kZeros);
  }
  EXPECT_EQ(m[0]->input_count({.B = 3}), 0u) << "the first unit reads mb.features";
  EXPECT_EQ(m[1]->input_count({.B = 3}), 3u * 256);
  EXPECT_EQ(m[2]->output_count({.B = 3}), 1u);
}

TEST(MlpConfig, InvalidFieldsAreRejected) {
  EXPECT_THROW(make_mlp({.inputs = 0}), InvalidArgument);
  EXPECT_THROW(make_mlp({.hidden = 0}), InvalidArgument);
  EXPECT_THROW(make_mlp({.hidden_layers = -1}), InvalidArgument);
  EXPECT_THROW(make_mlp({.classes = 0}), InvalidArgument);
  EXPECT_EQ(make_mlp({.hidden = 0, .hidden_layers = 0}).size(), 1u);
}

struct SmallMlp {
  explicit SmallMlp(int hidden_layers)
      : model(make_mlp({.inputs = 12, .hidden = 7, .hidden_layers = hidden_layers, .classes = 5})) {
  }
  Model model;
  std::vector<float> features = model_testing::normal_vector(3 * 12, 21, 1.0f);
  std::vector<int32_t> labels = {4, 0, 2};
  MicroBatch mb() const {
    MicroBatch b;
    b.shape = {.B = 3, .T = 1};
    b.features = features;
    b.targets = labels;
    return b;
  }
};

// As for the gpt (gpt_test.cc): the loss's fp32 rounding over the steps stays below 6e-5
// (measured), the gradients checked are ~1e-2 and up.
constexpr model_testing::Tolerance kModelTolerance{1e-2f, 3e-4, 1e-3};

TEST(MlpGradients, EveryParameterMatchesFiniteDifferences) {
  SmallMlp s(2);
  Buffers w = random_weights(s.model, 22, 0.5f);
  model_testing::expect_model_gradients_match(s.model, w, s.mb(), kModelTolerance);
}

TEST(MlpGradients, HeadAloneMatchesFiniteDifferences) {
  SmallMlp s(0);
  Buffers w = random_weights(s.model, 23, 0.5f);
  model_testing::expect_model_gradients_match(s.model, w, s.mb(), kModelTolerance);
}

TEST(MlpGradients, LossGradScaleScalesEveryGradient) {
  SmallMlp s(2);
  const Buffers w = random_weights(s.model, 24, 0.5f);
  MicroBatch mb = s.mb();
  Buffers g1 = zero_grads(s.model), g4 = zero_grads(s.model);
  model_loss_and_grads(s.model, w, mb, g1);
  mb.loss_grad_scale = 4.0f;  // a power of two: exact
  model_loss_and_grads(s.model, w, mb, g4);
  for (size_t u = 0; u < g1.size(); ++u) {
    for (size_t i = 0; i < g1[u].size(); ++i) ASSERT_EQ(g4[u][i], 4.0f * g1[u][i]);
  }
}

TEST(MlpTensorUse, WeightsAreReadOnlyAsBf16ProductOperands) {
  if (!gemm_bf16_native()) GTEST_SKIP() << "no native bf16 products: scopes are not consulted";
  SmallMlp s(2);
  const Buffers w = random_weights(s.model, 25, 0.5f);
  model_testing::expect_product_operands_are_read_only_as_bf16(s.model, w, s.mb());
}

TEST(MlpUnits, SequencesAreRejected) {
  SmallMlp s(1);
  const Buffers w = random_weights(s.model, 25, 0.5f);
  MicroBatch mb = s.mb();
  mb.shape.T = 2;
  EXPECT_THROW(model_loss(s.model, w, mb), InvalidArgument);
}

TEST(MlpUnits, FeatureCountMismatchIsRejected) {
  SmallMlp s(1);
  const Buffers w = random_weights(s.model, 26, 0.5f);
  s.features.pop_back();
  EXPECT_THROW(model_loss(s.model, w, s.mb()), InvalidArgument);
}

}  // namespace
}  // namespace zerodp
