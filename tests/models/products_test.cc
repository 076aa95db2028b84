// Unit::products against gemm() itself: the shapes a model declares for a micro-batch are
// exactly the distinct shapes its forward and backward call, so the model-shape GEMM peak
// (train/setup.h) times what training multiplies and cannot drift from it.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "model_testing.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "models/mlp.h"
#include "models/model.h"
#include "tensor/gemm.h"

namespace zerodp {
namespace {

std::string describe(const std::vector<GemmShape>& shapes) {
  std::ostringstream out;
  for (const GemmShape& g : shapes) {
    out << (g.trans_a == Transpose::kYes ? 'T' : 'N') << (g.trans_b == Transpose::kYes ? 'T' : 'N')
        << ' ' << g.M << 'x' << g.N << 'x' << g.K << "; ";
  }
  return out.str();
}

// One forward + backward of `model` on `mb`, recorded; compared with the declaration.
void expect_declared_equals_called(const Model& model, const MicroBatch& mb) {
  const model_testing::Buffers w = model_testing::random_weights(model, 7, 0.05f);
  model_testing::Buffers g = model_testing::zero_grads(model);
  std::vector<GemmShape> called;
  {
    const GemmRecording rec;
    model_loss_and_grads(model, w, mb, g);
    called = distinct_shapes(rec.shapes());
  }
  const std::vector<GemmShape> declared = model_products(model, mb.shape);
  ASSERT_FALSE(called.empty());
  EXPECT_EQ(declared, called) << "declared: " << describe(declared)
                              << "\ncalled:   " << describe(called);
}

void expect_gpt(const GptConfig& config, int B, int T) {
  const Model model = make_gpt(config);
  std::mt19937 gen(3);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % static_cast<unsigned>(config.vocab));
  for (auto& t : targets) t = static_cast<int32_t>(gen() % static_cast<unsigned>(config.vocab));
  MicroBatch mb;
  mb.shape = {.B = B, .T = T};
  mb.tokens = tokens;
  mb.targets = targets;
  expect_declared_equals_called(model, mb);
}

void expect_llama(const LlamaConfig& config, int B, int T) {
  const Model model = make_llama(config);
  std::mt19937 gen(4);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % static_cast<unsigned>(config.vocab));
  for (auto& t : targets) t = static_cast<int32_t>(gen() % static_cast<unsigned>(config.vocab));
  MicroBatch mb;
  mb.shape = {.B = B, .T = T};
  mb.tokens = tokens;
  mb.targets = targets;
  expect_declared_equals_called(model, mb);
}

void expect_mlp(const MlpConfig& config, int B) {
  const Model model = make_mlp(config);
  const std::vector<float> features =
      model_testing::normal_vector(static_cast<size_t>(B * config.inputs), 5, 1.0f);
  std::vector<int32_t> labels(static_cast<size_t>(B));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(i) % config.classes;
  MicroBatch mb;
  mb.shape = {.B = B, .T = 1};
  mb.features = features;
  mb.targets = labels;
  expect_declared_equals_called(model, mb);
}

TEST(ModelProducts, GptPresetsDeclareWhatTheyCall) {
  for (const char* size : {"tiny", "small", "medium"}) {
    SCOPED_TRACE(size);
    const GptPreset& p = gpt_preset(size);
    expect_gpt(p.config, p.micro_batch, p.config.seq_len);
  }
}

TEST(ModelProducts, GptWithPartialQueryBlocksAndShortSequences) {
  // T = 100: attention's query blocks of 64 and 36 rows; T = 40 < seq_len: one block.
  const GptConfig c{.layers = 1, .heads = 2, .embd = 32, .seq_len = 100};
  expect_gpt(c, 2, 100);
  expect_gpt(c, 3, 40);
}

TEST(ModelProducts, LlamaPresetsDeclareWhatTheyCall) {
  for (const char* size : {"tiny", "small", "medium"}) {
    SCOPED_TRACE(size);
    const LlamaPreset& p = llama_preset(size);
    expect_llama(p.config, p.micro_batch, p.config.seq_len);
  }
}

// The head's blocks of 64 rows: 200 rows are three and a last of 8 (and attention's query
// blocks 64 and 36), 120 rows one and a last of 56, 20 rows one short block; kv_heads == heads
// and kv_heads == 1 change the q/k/v product's width.
TEST(ModelProducts, LlamaWithPartialBlocksAndEveryKvSharing) {
  const LlamaConfig c{
      .layers = 1, .heads = 4, .kv_heads = 2, .embd = 32, .ffn = 64, .seq_len = 100, .vocab = 50};
  expect_llama(c, 2, 100);
  expect_llama(c, 3, 40);
  expect_llama(c, 1, 20);
  LlamaConfig mha = c;
  mha.kv_heads = 4;
  expect_llama(mha, 2, 30);
  LlamaConfig mqa = c;
  mqa.kv_heads = 1;
  expect_llama(mqa, 2, 30);
}

TEST(ModelProducts, MlpDeclaresWhatItCalls) {
  expect_mlp(MlpConfig{}, 16);
  // No hidden layer: the head reads the features and makes no input-gradient product.
  expect_mlp(MlpConfig{.inputs = 20, .hidden = 8, .hidden_layers = 0, .classes = 3}, 5);
}

TEST(ModelProducts, DependOnTheMicroBatch) {
  const Model m = make_gpt(gpt_preset("small").config);
  const auto a = model_products(m, {.B = 16, .T = 64});
  const auto b = model_products(m, {.B = 8, .T = 64});
  EXPECT_FALSE(a.empty());
  EXPECT_NE(a, b);
  // c_fc's forward for 16 x 64 rows: (rows, 4C) = (rows, C) @ W^T.
  const GemmShape fc{Transpose::kNo, Transpose::kYes, 1024, 512, 128};
  EXPECT_NE(std::find(a.begin(), a.end(), fc), a.end()) << describe(a);
}

}  // namespace
}  // namespace zerodp
