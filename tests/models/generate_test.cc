// Generation from a gpt: next-token logits against the training forward, greedy and sampled
// decoding, the sliding context window, the end-of-sequence token, the whole window's logits
// (gpt_logits), the portable random draw, and bad options. The llama's generator is
// llama_generate_test.cc's.
#include "models/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "generate_testing.h"
#include "model_testing.h"
#include "models/model.h"
#include "nn/layers.h"

namespace zerodp {
namespace {

using model_testing::Buffers;
using model_testing::random_weights;

constexpr GptConfig kConfig{.layers = 2, .heads = 2, .embd = 32, .seq_len = 16, .vocab = 256};

// Weights of scale 0.3 spread the logits (std ~ 1.7), so sampled text varies and argmaxes
// are not near-ties.
Buffers test_weights(const GptConfig& config = kConfig, uint32_t seed = 21) {
  return random_weights(make_gpt(config), seed, 0.3f);
}

using generate_testing::bytes_of;
using generate_testing::greedy;

GenerateOptions sampled(int max_tokens, uint64_t seed, double temperature = 1.0, int top_k = 0) {
  return GenerateOptions{
      .max_tokens = max_tokens, .temperature = temperature, .top_k = top_k, .seed = seed};
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

// The independent route: the training forward (every unit, the head's loss) with only the
// last position counted and target j gives loss_j = logsumexp(logits) - logits[j], so
// logits[j] - logits[0] = loss_0 - loss_j, and the argmax is the target of least loss.
TEST(GenerateLogits, MatchTheTrainingForwardsLoss) {
  const Buffers w = test_weights();
  const Model model = make_gpt(kConfig);
  const std::vector<int32_t> prompt = bytes_of("In the beginning");  // 16 = seq_len
  Generator gen(kConfig, w);
  const std::vector<float> logits = gen.next_token_logits(prompt);
  ASSERT_EQ(logits.size(), 256u);

  std::vector<int32_t> targets(prompt.size(), kIgnoreTarget);
  std::vector<double> loss(256);
  for (int j = 0; j < 256; ++j) {
    targets.back() = j;
    MicroBatch mb;
    mb.shape = BatchShape{1, static_cast<int>(prompt.size())};
    mb.tokens = prompt;
    mb.targets = targets;
    loss[static_cast<size_t>(j)] = model_loss(model, w, mb);
  }
  double worst = 0;
  for (size_t j = 0; j < 256; ++j) {
    const double from_loss = loss[0] - loss[j];
    const double direct = static_cast<double>(logits[j]) - logits[0];
    worst = std::max(worst, std::abs(from_loss - direct));
  }
  EXPECT_LT(worst, 1e-4);  // fp32 losses of ~6 carry ~1e-6 each
  const size_t best =
      static_cast<size_t>(std::min_element(loss.begin(), loss.end()) - loss.begin());
  EXPECT_EQ(argmax(logits), best);
}

TEST(GenerateGreedy, FirstTokenIsTheArgmaxOfTheTrainingForward) {
  const Buffers w = test_weights();
  const Model model = make_gpt(kConfig);
  const std::string prompt = "The LORD";
  const std::vector<int32_t> tokens = bytes_of(prompt);
  std::vector<int32_t> targets(tokens.size(), kIgnoreTarget);
  int best = -1;
  double best_loss = INFINITY, second_loss = INFINITY;
  for (int j = 0; j < 256; ++j) {
    targets.back() = j;
    MicroBatch mb;
    mb.shape = BatchShape{1, static_cast<int>(tokens.size())};
    mb.tokens = tokens;
    mb.targets = targets;
    const double l = model_loss(model, w, mb);
    if (l < best_loss) {
      second_loss = best_loss;
      best_loss = l;
      best = j;
    } else {
      second_loss = std::min(second_loss, l);
    }
  }
  ASSERT_GT(second_loss - best_loss, 1e-3) << "a near-tie: pick other weights";
  const std::string out = generate(kConfig, w, prompt, greedy(1));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(static_cast<unsigned char>(out[0]), best);
}

TEST(GenerateGreedy, IsDeterministicAndEachStepIsTheArgmax) {
  const Buffers w = test_weights();
  Generator gen(kConfig, w);
  const std::string a = gen.generate("And God said", greedy(24));
  EXPECT_EQ(a, gen.generate("And God said", greedy(24)));
  EXPECT_EQ(a, generate(kConfig, w, "And God said", greedy(24)));  // a fresh generator
  ASSERT_EQ(a.size(), 24u);
  std::vector<int32_t> context = bytes_of("And God said");
  for (char c : a) {
    const size_t next = argmax(gen.next_token_logits(context));
    EXPECT_EQ(static_cast<unsigned char>(c), next);
    context.push_back(static_cast<int32_t>(next));
  }
}

TEST(GenerateGreedy, SeedDoesNotMatter) {
  const Buffers w = test_weights();
  GenerateOptions o = greedy(20);
  o.seed = 1;
  const std::string a = generate(kConfig, w, "x", o);
  o.seed = 99;
  EXPECT_EQ(a, generate(kConfig, w, "x", o));
}

TEST(GenerateGreedy, OnByteSeesEveryByteInOrder) {
  const Buffers w = test_weights();
  Generator gen(kConfig, w);
  std::string streamed;
  const std::string out =
      gen.generate("In", sampled(30, 4), [&](char c) { streamed.push_back(c); });
  EXPECT_EQ(streamed, out);
}

TEST(GenerateSampling, SameSeedRepeatsDifferentSeedDiffers) {
  const Buffers w = test_weights();
  Generator gen(kConfig, w);
  const std::string a = gen.generate("In the", sampled(64, 7));
  EXPECT_EQ(a, gen.generate("In the", sampled(64, 7)));
  EXPECT_NE(a, gen.generate("In the", sampled(64, 8)));
  EXPECT_NE(a, gen.generate("In the", greedy(64)));
}

TEST(GenerateSampling, TinyTemperatureIsGreedy) {
  const Buffers w = test_weights();
  Generator gen(kConfig, w);
  const std::string g = gen.generate("In the", greedy(40));
  for (uint64_t seed : {1u, 2u, 3u}) {
    EXPECT_EQ(g, gen.generate("In the", sampled(40, seed, 1e-8))) << "seed " << seed;
  }
}

TEST(GenerateSampling, TopKOneIsGreedy) {
  const Buffers w = test_weights();
  Generator gen(kConfig, w);
  const std::string g = gen.generate("In the", greedy(40));
  for (uint64_t seed : {1u, 2u, 3u}) {
    EXPECT_EQ(g, gen.generate("In the", sampled(40, seed, 5.0, 1))) << "seed " << seed;
  }
}

// At a high temperature the distribution is nearly flat, so whatever is drawn comes from
// top_k alone.
TEST(GenerateSampling, TopKKeepsOnlyTheKLargest) {
  const Buffers w = test_weights();
  Generator gen(kConfig, w);
  const std::vector<float> logits = gen.next_token_logits(bytes_of("In the"));
  std::vector<size_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  const std::set<size_t> top3(order.begin(), order.begin() + 3);
  std::set<size_t> seen_k, seen_all;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    seen_k.insert(
        static_cast<unsigned char>(gen.generate("In the", sampled(1, seed, 100.0, 3))[0]));
    seen_all.insert(static_cast<unsigned char>(gen.generate("In the", sampled(1, seed, 100.0))[0]));
  }
  EXPECT_EQ(seen_k, top3);
  EXPECT_GT(seen_all.size(), 50u);
}

TEST(GenerateContext, SlidesPastSeqLen) {
  const Buffers w = test_weights();
  Generator gen(kConfig, w);
  // 3 + 50 tokens: the window fills at 16 and slides for the rest.
  EXPECT_EQ(gen.generate("abc", greedy(50)).size(), 50u);
  EXPECT_EQ(gen.generate("abc", sampled(50, 3)).size(), 50u);
  // Only the last seq_len bytes of a long prompt are seen: the same window gives the same
  // bits, one byte fewer (every position shifted) other logits.
  const std::string long_prompt = "0123456789abcdefghijklmnopqrstuvwxyz";
  const std::string last16 = long_prompt.substr(long_prompt.size() - 16);
  EXPECT_EQ(gen.generate(long_prompt, greedy(20)), gen.generate(last16, greedy(20)));
  EXPECT_EQ(gen.next_token_logits(bytes_of(long_prompt)), gen.next_token_logits(bytes_of(last16)));
  EXPECT_NE(gen.next_token_logits(bytes_of(long_prompt)),
            gen.next_token_logits(bytes_of(last16.substr(1))));
}

TEST(GenerateContext, EmptyPromptStartsFromNewline) {
  const Buffers w = test_weights();
  Generator gen(kConfig, w);
  EXPECT_EQ(gen.generate("", greedy(10)), gen.generate("\n", greedy(10)));
  EXPECT_EQ(gen.generate("", sampled(10, 5)), gen.generate("\n", sampled(10, 5)));
  EXPECT_EQ(gen.generate("abc", greedy(0)), "");
}

TEST(GenerateEos, StopsBeforeTheTokenAndDoesNotReturnIt) {
  const Buffers w = test_weights();
  Generator gen(kConfig, w);
  const std::string text = gen.generate("In the", sampled(40, 3));
  // The first byte not seen before offset 4: the text stops exactly there.
  size_t stop = 4;
  while (stop < text.size() && text.substr(0, stop).find(text[stop]) != std::string::npos) ++stop;
  ASSERT_LT(stop, text.size()) << "every byte repeats: pick another seed";
  GenerateOptions o = sampled(40, 3);
  o.eos = static_cast<unsigned char>(text[stop]);
  std::string streamed;
  EXPECT_EQ(gen.generate("In the", o, [&](char c) { streamed.push_back(c); }),
            text.substr(0, stop));
  EXPECT_EQ(streamed, text.substr(0, stop));
  o.eos = 256;
  EXPECT_NE(error_of([&] { gen.generate("In the", o); }).find("eos is 256"), std::string::npos);
}

// Row t of the window's logits is the next-token logits after tokens 0..t (the window is
// causal), within fp32 rounding: the products see other row counts.
TEST(GptLogits, EachRowIsThePrefixsNextTokenLogits) {
  const Buffers w = test_weights();
  Generator gen(kConfig, w);
  const std::vector<int32_t> tokens = bytes_of("In the beginning");  // 16 = seq_len
  const std::vector<float> all = gpt_logits(kConfig, w, tokens);
  ASSERT_EQ(all.size(), 16u * 256u);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::vector<float> next = gen.next_token_logits(std::span(tokens).first(t + 1));
    double worst = 0, scale = 0;
    for (size_t j = 0; j < 256; ++j) {
      worst = std::max(worst, std::abs(static_cast<double>(all[t * 256 + j]) - next[j]));
      scale = std::max(scale, std::abs(static_cast<double>(next[j])));
    }
    EXPECT_LT(worst, 1e-5 * scale) << "row " << t;
  }
  EXPECT_NE(error_of([&] {
              (void)gpt_logits(kConfig, w, bytes_of("0123456789abcdefg"));
            }).find("17 tokens"),
            std::string::npos);
  // Any vocabulary: no byte is written.
  GptConfig large = kConfig;
  large.vocab = 300;
  const Buffers wl = test_weights(large);
  EXPECT_EQ(gpt_logits(large, wl, std::vector<int32_t>{299, 1}).size(), 600u);
  EXPECT_FALSE(find_non_finite(large, wl).has_value());
}

TEST(PromptTokens, AreTheBytesOrANewline) {
  EXPECT_EQ(prompt_tokens("", 256), std::vector<int32_t>{'\n'});
  EXPECT_EQ(prompt_tokens("ab", 256), (std::vector<int32_t>{'a', 'b'}));
  EXPECT_NE(error_of([] { (void)prompt_tokens("a\xff", 128); }).find("prompt byte 255 at offset 1"),
            std::string::npos);
}

// The published splitmix64 sequence for seed 0, so the draws are the same everywhere.
TEST(GenerateRng, IsSplitMix64) {
  GenerateRng rng(0);
  EXPECT_EQ(rng.next(), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(rng.next(), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(rng.next(), 0x06c45d188009454fULL);
}

uint64_t draw_for(double u) { return static_cast<uint64_t>(u * 0x1.0p53) << 11; }

TEST(PickToken, DrawsFromTheSoftmaxInIndexOrder) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  EXPECT_EQ(pick_token(logits, 1.0, 0, draw_for(0.0)), 0);
  EXPECT_EQ(pick_token(logits, 1.0, 0, draw_for(0.2)), 0);
  EXPECT_EQ(pick_token(logits, 1.0, 0, draw_for(0.3)), 1);
  EXPECT_EQ(pick_token(logits, 1.0, 0, ~uint64_t{0}), 1);
  // Temperature 2 flattens to p = 1/(1 + sqrt 3) ~ 0.366 for token 0.
  EXPECT_EQ(pick_token(logits, 2.0, 0, draw_for(0.35)), 0);
  EXPECT_EQ(pick_token(logits, 2.0, 0, draw_for(0.38)), 1);
  GenerateRng rng(42);
  int ones = 0;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ones += pick_token(logits, 1.0, 0, rng.next());
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.01);
}

TEST(PickToken, GreedyAndTopKBreakTiesToTheLowestIndex) {
  const std::vector<float> logits = {1.0f, 5.0f, 5.0f, 2.0f};
  EXPECT_EQ(pick_token(logits, 0.0, 0, 0), 1);
  EXPECT_EQ(pick_token(logits, 3.0, 1, draw_for(0.9)), 1);
  const std::vector<float> boundary = {5.0f, 3.0f, 3.0f, 3.0f};
  std::set<int32_t> seen;
  GenerateRng rng(1);
  for (int i = 0; i < 500; ++i) seen.insert(pick_token(boundary, 10.0, 2, rng.next()));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
}

TEST(GenerateErrors, BadOptionsNameTheValue) {
  const Buffers w = test_weights();
  Generator gen(kConfig, w);
  EXPECT_NE(error_of([&] { gen.generate("a", sampled(5, 1, -1.0)); }).find("temperature is -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gen.generate("a", sampled(5, 1, std::nan(""))); }).find("temperature"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gen.generate("a", sampled(5, 1, INFINITY)); }).find("temperature"),
            std::string::npos);
  const std::string k = error_of([&] { gen.generate("a", sampled(5, 1, 1.0, 257)); });
  EXPECT_NE(k.find("top_k is 257"), std::string::npos) << k;
  EXPECT_NE(k.find("1..256"), std::string::npos) << k;
  EXPECT_NE(error_of([&] { gen.generate("a", sampled(5, 1, 1.0, -1)); }).find("top_k is -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gen.generate("a", greedy(-1)); }).find("max_tokens is -1"),
            std::string::npos);
  EXPECT_NO_THROW(gen.generate("a", sampled(2, 1, 1.0, 256)));
}

TEST(GenerateErrors, WrongWeightsNameTheUnitAndBothLengths) {
  Buffers w = test_weights();
  const Model model = make_gpt(kConfig);
  w[2].pop_back();
  const std::string e = error_of([&] { Generator gen(kConfig, w); });
  EXPECT_NE(e.find("unit h.1"), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string(model[2]->numel() - 1)), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string(model[2]->numel())), std::string::npos) << e;
  w.pop_back();
  const std::string n = error_of([&] { Generator gen(kConfig, w); });
  EXPECT_NE(n.find("3 weight buffers"), std::string::npos) << n;
  EXPECT_NE(n.find("4 units"), std::string::npos) << n;
}

TEST(GenerateErrors, PromptBytesOutsideASmallVocabularyAndLargeVocabularies) {
  GptConfig small = kConfig;
  small.vocab = 128;
  const Buffers w = test_weights(small);
  Generator gen(small, w);
  EXPECT_EQ(gen.generate("plain ascii", greedy(5)).size(), 5u);
  const std::string e = error_of([&] { gen.generate("caf\xc3\xa9", greedy(5)); });
  EXPECT_NE(e.find("prompt byte 195 at offset 3"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { gen.next_token_logits(std::vector<int32_t>{}); }).find("empty"),
            std::string::npos);

  GptConfig large = kConfig;
  large.vocab = 300;
  const Buffers wl = test_weights(large);
  // A tokenizer's vocabulary builds and gives logits; only bytes cannot be written from it.
  Generator g300(large, wl);
  EXPECT_EQ(g300.next_token_logits(std::vector<int32_t>{299}).size(), 300u);
  EXPECT_NE(error_of([&] { g300.generate("a", greedy(1)); }).find("vocab is 300"),
            std::string::npos);
  const std::vector<int32_t> ids =
      generate_ids({299, 7}, greedy(4), 300,
                   [&](std::span<const int32_t> c) { return g300.next_token_logits(c); }, {});
  EXPECT_EQ(ids.size(), 4u);
  GptConfig bad = kConfig;
  bad.heads = 3;
  EXPECT_NE(error_of([&] { Generator g(bad, w); }).find("heads 3"), std::string::npos);
}

TEST(PickTokenErrors, NonFiniteLogitsAndBadArguments) {
  EXPECT_NE(error_of([] {
              pick_token(std::vector<float>{0.0f, NAN}, 1.0, 0, 0);
            }).find("logit 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { pick_token(std::vector<float>{}, 1.0, 0, 0); }).find("empty"),
            std::string::npos);
  EXPECT_NE(error_of([] { pick_token(std::vector<float>{0.0f}, 1.0, 2, 0); }).find("top_k is 2"),
            std::string::npos);
}

// The first non-finite weight in model order, by tensor name and element; none in finite
// weights. A loader refuses such a model up front instead of at the first token's logits.
TEST(FindNonFinite, NamesTheFirstTensorAndElementInModelOrder) {
  Buffers w = test_weights();
  EXPECT_FALSE(find_non_finite(kConfig, w).has_value());
  const Model model = make_gpt(kConfig);
  const auto offset_of = [&](size_t unit, std::string_view name) {
    for (const TensorSpec& t : model[unit]->tensors()) {
      if (t.name == name) return t.offset;
    }
    ADD_FAILURE() << "no tensor " << name;
    return size_t{0};
  };
  w[2][offset_of(2, "h.1.mlp.c_fc.weight") + 5] = INFINITY;
  w[1][offset_of(1, "h.0.attn.c_proj.bias") + 3] = NAN;
  const auto bad = find_non_finite(kConfig, w);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->tensor, "h.0.attn.c_proj.bias");
  EXPECT_EQ(bad->element, 3u);
  EXPECT_TRUE(std::isnan(bad->value));
  w[1][offset_of(1, "h.0.attn.c_proj.bias") + 3] = 0.0f;
  const auto inf = find_non_finite(kConfig, w);
  ASSERT_TRUE(inf.has_value());
  EXPECT_EQ(inf->tensor, "h.1.mlp.c_fc.weight");
  EXPECT_EQ(inf->element, 5u);
  EXPECT_TRUE(std::isinf(inf->value));
}

}  // namespace
}  // namespace zerodp
