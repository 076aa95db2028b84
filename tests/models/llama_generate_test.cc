// Generation from a llama with a KV cache: the cached logits against llama_logits' last row
// at every step, cached greedy against the full-window recompute (LlamaGenerator::Cache::kOff)
// token for token, grouped-query sharing at every grouping, the slide past seq_len (the cache
// rebuilt from position 0), the end-of-sequence token, and refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "generate_testing.h"
#include "model_testing.h"
#include "models/generate.h"
#include "models/llama.h"

namespace zerodp {
namespace {

using model_testing::Buffers;
using model_testing::random_weights;

// 4 query heads over 2 kv heads (groups of two), head size 8.
constexpr LlamaConfig kConfig{
    .layers = 2, .heads = 4, .kv_heads = 2, .embd = 32, .ffn = 64, .seq_len = 64, .vocab = 256};

// Weights of scale 0.3 spread the logits, so greedy argmaxes are not near-ties (checked
// where it matters) and sampled text varies.
Buffers test_weights(const LlamaConfig& config = kConfig, uint32_t seed = 5) {
  return random_weights(make_llama(config), seed, 0.3f);
}

using generate_testing::bytes_of;
using generate_testing::greedy;

// llama_logits' last row for the last min(length, seq_len) tokens of `context`: the
// reference the cache is checked against.
std::vector<float> reference_logits(const LlamaConfig& c, const Buffers& w,
                                    std::span<const int32_t> context) {
  const auto window = context.last(std::min(context.size(), static_cast<size_t>(c.seq_len)));
  const std::vector<float> all = llama_logits(c, w, window, 1, static_cast<int>(window.size()));
  return {all.end() - c.vocab, all.end()};
}

// max |a - b| over the row, relative to the row's largest |b|.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return worst / scale;
}

// The gap between the largest and the second largest logit.
double top_gap(const std::vector<float>& v) {
  std::vector<float> s = v;
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<>());
  return static_cast<double>(s[0]) - s[1];
}

size_t argmax(const std::vector<float>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no InvalidArgument thrown";
}

// Greedy decoding step by step through next_token_logits, each step's cached logits
// against the reference; returns the tokens.
std::vector<int32_t> check_steps(const LlamaConfig& c, const Buffers& w, std::string_view prompt,
                                 int steps) {
  LlamaGenerator gen(c, w);
  std::vector<int32_t> context = bytes_of(prompt);
  std::vector<int32_t> out;
  for (int i = 0; i < steps; ++i) {
    const std::vector<float> cached = gen.next_token_logits(context);
    const std::vector<float> full = reference_logits(c, w, context);
    EXPECT_LT(relative_difference(cached, full), 1e-4) << "step " << i;
    EXPECT_GT(top_gap(full), 1e-3) << "a near-tie at step " << i << ": pick other weights";
    const auto next = static_cast<int32_t>(argmax(cached));
    EXPECT_EQ(next, static_cast<int32_t>(argmax(full))) << "step " << i;
    context.push_back(next);
    out.push_back(next);
  }
  return out;
}

TEST(LlamaGenerate, CachedLogitsAreLlamaLogitsLastRowAtEveryStep) {
  const Buffers w = test_weights();
  (void)check_steps(kConfig, w, "In the beginning", 40);  // 16 + 40 <= 64: within the context
}

TEST(LlamaGenerate, EveryGroupingOfKvHeadsMatches) {
  for (const int kv : {1, 2, 4}) {
    LlamaConfig c = kConfig;
    c.kv_heads = kv;
    const Buffers w = test_weights(c, 7);
    SCOPED_TRACE(fmt::format("kv_heads {}", kv));
    (void)check_steps(c, w, "And God said", 20);
  }
}

TEST(LlamaGenerate, CachedGreedyIsUncachedGreedyTokenForToken) {
  const Buffers w = test_weights();
  LlamaGenerator cached(kConfig, w);
  LlamaGenerator full(kConfig, w, LlamaGenerator::Cache::kOff);
  const std::string a = cached.generate("In the beginning", greedy(40));
  ASSERT_EQ(a.size(), 40u);
  EXPECT_EQ(a, full.generate("In the beginning", greedy(40)));
  // The prompt's 16 rows once, then one row a token (the 40th token's needs the 39th).
  EXPECT_EQ(cached.counters().rows, 16u + 39u);
  EXPECT_EQ(cached.counters().rebuilds, 0u);
  EXPECT_EQ(full.counters().rows, 16u * 40u + 39u * 40u / 2u);
  // The same again from the same generator: another context drops the cache.
  EXPECT_EQ(a, cached.generate("In the beginning", greedy(40)));
  EXPECT_EQ(cached.counters().rebuilds, 1u);
}

TEST(LlamaGenerate, SampledTextRepeatsWithTheSeed) {
  const Buffers w = test_weights();
  LlamaGenerator gen(kConfig, w);
  const GenerateOptions o{.max_tokens = 40, .temperature = 1.0, .top_k = 20, .seed = 7};
  const std::string a = gen.generate("In the", o);
  EXPECT_EQ(a, gen.generate("In the", o));
  EXPECT_EQ(a, LlamaGenerator(kConfig, w).generate("In the", o));
  GenerateOptions other = o;
  other.seed = 8;
  EXPECT_NE(a, gen.generate("In the", other));
  EXPECT_NE(a, gen.generate("In the", greedy(40)));
}

// Past seq_len the window slides: the last seq_len tokens at positions 0.., as the gpt's. Each
// token then rebuilds the cache from scratch over the new window.
TEST(LlamaGenerate, PastTheContextTheWindowSlidesAndTheCacheIsRebuilt) {
  LlamaConfig c = kConfig;
  c.seq_len = 16;
  const Buffers w = test_weights(c);
  LlamaGenerator cached(c, w);
  LlamaGenerator full(c, w, LlamaGenerator::Cache::kOff);
  const std::string a = cached.generate("0123456789", greedy(30));
  EXPECT_EQ(a, full.generate("0123456789", greedy(30)));
  // Contexts of 10..39 tokens: the prompt's 10 rows, one row each up to 16 tokens (6), then 23
  // windows that slid, each rebuilt whole (16 rows).
  EXPECT_EQ(cached.counters().rebuilds, 23u);
  EXPECT_EQ(cached.counters().rows, 10u + 6u + 23u * 16u);

  // A rebuilt cache is the window's from position 0: the same logits as the window alone, and
  // the step after it (a slide again) too.
  std::vector<int32_t> context = bytes_of("0123456789abcdefghij");  // 20 > 16
  LlamaGenerator gen(c, w);
  const std::vector<float> slid = gen.next_token_logits(context);
  EXPECT_LT(relative_difference(slid, reference_logits(c, w, context)), 1e-4);
  EXPECT_EQ(slid, LlamaGenerator(c, w).next_token_logits(std::span(context).last(16)));
  EXPECT_NE(slid, LlamaGenerator(c, w).next_token_logits(std::span(context).last(15)));
  context.push_back(static_cast<int32_t>(argmax(slid)));
  EXPECT_LT(relative_difference(gen.next_token_logits(context), reference_logits(c, w, context)),
            1e-4);
  EXPECT_EQ(gen.counters().rebuilds, 1u);
  EXPECT_EQ(gen.counters().rows, 32u);
  // Asking again for the same context runs nothing.
  (void)gen.next_token_logits(context);
  EXPECT_EQ(gen.counters().rows, 32u);
}

TEST(LlamaGenerate, TheEndOfSequenceTokenStopsAndIsNotWritten) {
  const Buffers w = test_weights();
  LlamaGenerator gen(kConfig, w);
  const std::string text = gen.generate("In the", greedy(30));
  // The first byte not seen before position 5 (so the text stops exactly there).
  size_t stop = 5;
  while (stop < text.size() && text.substr(0, stop).find(text[stop]) != std::string::npos) ++stop;
  ASSERT_LT(stop, text.size()) << "every byte repeats: pick other weights";
  GenerateOptions o = greedy(30);
  o.eos = static_cast<unsigned char>(text[stop]);
  std::string streamed;
  EXPECT_EQ(gen.generate("In the", o, [&](char ch) { streamed.push_back(ch); }),
            text.substr(0, stop));
  EXPECT_EQ(streamed, text.substr(0, stop));
  // A token never drawn changes nothing.
  o.eos = 0;
  EXPECT_EQ(gen.generate("In the", o), text);
  o.eos = 256;
  EXPECT_NE(error_of([&] { gen.generate("In the", o); }).find("eos is 256"), std::string::npos);
  o.eos = -1;
  EXPECT_NE(error_of([&] { gen.generate("In the", o); }).find("0..255"), std::string::npos);
}

TEST(LlamaGenerate, EmptyPromptStartsFromNewline) {
  const Buffers w = test_weights();
  LlamaGenerator gen(kConfig, w);
  EXPECT_EQ(gen.generate("", greedy(10)), gen.generate("\n", greedy(10)));
  EXPECT_EQ(gen.generate("abc", greedy(0)), "");
}

TEST(LlamaGenerateErrors, WeightsVocabularyAndContext) {
  Buffers w = test_weights();
  const Model model = make_llama(kConfig);
  Buffers short_unit = w;
  short_unit[2].pop_back();
  const std::string e = error_of([&] { LlamaGenerator g(kConfig, short_unit); });
  EXPECT_NE(e.find("unit h.1"), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string(model[2]->numel() - 1)), std::string::npos) << e;
  Buffers fewer = w;
  fewer.pop_back();
  const std::string n = error_of([&] { LlamaGenerator g(kConfig, fewer); });
  EXPECT_NE(n.find("3 weight buffers"), std::string::npos) << n;
  EXPECT_NE(n.find("4 units"), std::string::npos) << n;

  LlamaGenerator gen(kConfig, w);
  EXPECT_NE(error_of([&] { gen.next_token_logits(std::vector<int32_t>{}); }).find("empty"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              gen.next_token_logits(std::vector<int32_t>{1, 256});
            }).find("token 256 at position 1"),
            std::string::npos);

  // A vocabulary past the bytes: logits yes, text no.
  LlamaConfig large = kConfig;
  large.vocab = 300;
  const Buffers wl = test_weights(large);
  LlamaGenerator big(large, wl);
  const std::vector<int32_t> tokens = {299, 3, 150};
  EXPECT_LT(relative_difference(big.next_token_logits(tokens), reference_logits(large, wl, tokens)),
            1e-4);
  EXPECT_NE(error_of([&] {
              big.generate("a", greedy(3));
            }).find("llama: vocab is 300; generation writes bytes, so it needs vocab <= 256"),
            std::string::npos);
}

TEST(LlamaFindNonFinite, NamesTheTensor) {
  Buffers w = test_weights();
  EXPECT_FALSE(find_non_finite(kConfig, w).has_value());
  const Model model = make_llama(kConfig);
  for (const TensorSpec& t : model[2]->tensors()) {
    if (t.name == "model.layers.1.mlp.up_proj.weight") w[2][t.offset + 4] = NAN;
  }
  const auto bad = find_non_finite(kConfig, w);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->tensor, "model.layers.1.mlp.up_proj.weight");
  EXPECT_EQ(bad->element, 4u);
}

}  // namespace
}  // namespace zerodp
