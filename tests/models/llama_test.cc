// The llama family's shape: the presets and the FFN rule as documented, TinyLlama's published
// parameter count for the 1.1b preset, and every refusal naming the field.
#include "models/llama.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace zerodp {
namespace {

std::string refusal(const LlamaConfig& c) {
  try {
    validate(c);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Llama, TheFfnRuleIsLlamasTruncateThenRoundUp) {
  EXPECT_EQ(llama_ffn_hidden(32, 64), 128);
  EXPECT_EQ(llama_ffn_hidden(128, 64), 384);
  EXPECT_EQ(llama_ffn_hidden(384, 64), 1024);
  EXPECT_EQ(llama_ffn_hidden(768, 256), 2048);
  EXPECT_EQ(llama_ffn_hidden(2048, 256), 5632);
  EXPECT_EQ(llama_ffn_hidden(4096, 256), 11008);  // Llama-2 7B's
  EXPECT_EQ(llama_ffn_multiple(384), 64);
  EXPECT_EQ(llama_ffn_multiple(385), 256);
  EXPECT_THROW(llama_ffn_hidden(0, 64), InvalidArgument);
}

TEST(Llama, EveryPresetIsValidAndItsFfnIsTheRules) {
  for (const LlamaPreset& p : llama_presets()) {
    EXPECT_NO_THROW(validate(p.config)) << p.name;
    EXPECT_EQ(p.config.ffn, llama_ffn_hidden(p.config.embd, llama_ffn_multiple(p.config.embd)))
        << p.name;
    EXPECT_GT(p.micro_batch, 0) << p.name;
  }
  EXPECT_EQ(llama_preset("tiny").config.vocab, 256);
  EXPECT_THROW(llama_preset("huge"), InvalidArgument);
}

// TinyLlama-1.1B: 22 layers, 2048 wide, 32 heads, 4 KV heads, FFN 5632, vocab 32000, an
// untied head.
TEST(Llama, TheOnePointOneBPresetHasTinyLlamasParameterCount) {
  const LlamaConfig& c = llama_preset("1.1b").config;
  EXPECT_EQ(c.head_size(), 64);
  EXPECT_EQ(llama_parameter_count(c), 1100048384u);
  // tiny by hand: embedding and head 2 x 256 x 32, per block 2 x 32 + 2 x 32 x 32 +
  // 2 x 32 x 16 + 3 x 32 x 128, and the final norm.
  EXPECT_EQ(llama_parameter_count(llama_preset("tiny").config),
            2u * 256 * 32 + 2u * (2 * 32 + 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 128) + 32);
}

TEST(Llama, RefusalsNameTheFieldAndWhatWouldWork) {
  LlamaConfig c;
  c.kv_heads = 3;
  EXPECT_NE(refusal(c).find("kv_heads 3 does not divide heads 4"), std::string::npos) << refusal(c);
  c = {};
  c.heads = 3;
  EXPECT_NE(refusal(c).find("heads 3 does not divide embd 128"), std::string::npos);
  c = {};
  c.embd = 12;
  c.heads = 4;
  c.kv_heads = 2;
  EXPECT_NE(refusal(c).find("head size embd / heads = 12 / 4 = 3 is odd"), std::string::npos);
  c = {};
  c.rope_theta = 1.0f;
  EXPECT_NE(refusal(c).find("rope_theta is 1"), std::string::npos);
  c = {};
  c.norm_eps = 0;
  EXPECT_NE(refusal(c).find("norm_eps is 0"), std::string::npos);
  c = {};
  c.vocab = 1;
  EXPECT_NE(refusal(c).find("vocab is 1"), std::string::npos);
  c = {};
  c.layers = 0;
  EXPECT_NE(refusal(c).find("layers is 0"), std::string::npos);
  EXPECT_EQ(refusal(LlamaConfig{}), "");
}

}  // namespace
}  // namespace zerodp
