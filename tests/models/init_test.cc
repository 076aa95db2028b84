// Initialization as a pure function of (seed, tensor name, element index).
#include "models/init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "models/gpt.h"

namespace zerodp {
namespace {

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

const TensorSpec& find(const Unit& u, const std::string& name) {
  for (const TensorSpec& t : u.tensors()) {
    if (t.name == name) return t;
  }
  throw InvalidArgument("no tensor " + name);
}

// Any three-way split [0, a), [a, b), [b, n) of a block's buffer (cuts mid-tensor, on
// tensor boundaries, empty pieces) reproduces the whole-buffer init bit for bit.
TEST(Init, AnySplitEqualsTheWholeBuffer) {
  const Model m = make_gpt({.layers = 2, .heads = 2, .embd = 16, .seq_len = 8});
  const Unit& block = *m[1];
  const size_t n = block.numel();
  const std::vector<float> whole = initial_weights(7, block);
  const TensorSpec& fc = find(block, "h.0.mlp.c_fc.weight");
  const std::pair<size_t, size_t> cuts[] = {{0, 0},
                                            {0, n},
                                            {n, n},
                                            {1, n - 1},
                                            {fc.offset, fc.offset + fc.numel},
                                            {fc.offset + 5, fc.offset + fc.numel + 3},
                                            {17, 18},
                                            {n / 3, 2 * n / 3}};
  for (const auto& [a, b] : cuts) {
    std::vector<float> pieces(n);
    initialize_range(7, block, 0, a, std::span<float>(pieces).first(a));
    initialize_range(7, block, a, b, std::span<float>(pieces).subspan(a, b - a));
    initialize_range(7, block, b, n, std::span<float>(pieces).subspan(b));
    EXPECT_TRUE(same_bits(pieces, whole)) << "split at " << a << ", " << b;
  }
}

// A range large enough to be split across the cores is still every element's own value.
TEST(Init, ARangeSplitAcrossThreadsIsEveryElementsValue) {
  const Model m = make_gpt({.layers = 1, .heads = 2, .embd = 192, .seq_len = 8});
  const Unit& block = *m[1];
  ASSERT_GT(block.numel(), size_t{400000});  // past two threads' shares
  const std::vector<float> w = initial_weights(11, block);
  for (const TensorSpec& t : block.tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      ASSERT_EQ(w[t.offset + i], initial_value(11, t, i)) << t.name << "[" << i << "]";
    }
  }
}

TEST(Init, ElementsAreInitialValueOfTheirTensor) {
  const Model m = make_gpt({.layers = 1, .heads = 1, .embd = 4, .seq_len = 3});
  for (const auto& u : m) {
    const std::vector<float> w = initial_weights(3, *u);
    for (const TensorSpec& t : u->tensors()) {
      for (size_t i = 0; i < t.numel; ++i) {
        ASSERT_EQ(w[t.offset + i], initial_value(3, t, i)) << t.name << "[" << i << "]";
      }
    }
  }
}

TEST(Init, ZerosAndOnesAreExact) {
  const Model m = make_gpt({.layers = 1, .heads = 1, .embd = 4, .seq_len = 3});
  const std::vector<float> w = initial_weights(1, *m[1]);
  for (const TensorSpec& t : m[1]->tensors()) {
    const float want = t.init == InitKind::kOnes ? 1.0f : 0.0f;
    if (t.init == InitKind::kNormal) continue;
    for (size_t i = 0; i < t.numel; ++i) ASSERT_EQ(w[t.offset + i], want) << t.name;
  }
}

TEST(Init, DifferentSeedsAndTensorsDiffer) {
  const Model m = make_gpt({.layers = 2, .heads = 2, .embd = 16, .seq_len = 8});
  const std::vector<float> a = initial_weights(1, *m[0]);
  const std::vector<float> b = initial_weights(2, *m[0]);
  size_t equal = 0;
  for (size_t i = 0; i < a.size(); ++i) equal += a[i] == b[i];
  EXPECT_EQ(equal, 0u) << "of " << a.size();
  // Same position in two blocks, different names: different values.
  const TensorSpec& w0 = find(*m[1], "h.0.attn.c_attn.weight");
  const TensorSpec& w1 = find(*m[2], "h.1.attn.c_attn.weight");
  EXPECT_NE(initial_value(1, w0, 0), initial_value(1, w1, 0));
  // Values follow the name, not the unit: the same tensor in a deeper model starts alike.
  const Model deeper = make_gpt({.layers = 4, .heads = 2, .embd = 16, .seq_len = 8});
  EXPECT_TRUE(same_bits(initial_weights(1, *m[0]), initial_weights(1, *deeper[0])));
}

// Sample statistics of n = 589,824 values: the mean's standard error is std/sqrt(n)
// (~0.0013 std) and the std's ~std/sqrt(2n) (~0.0009 std); the bounds are ~5 of those.
void expect_normal(const std::vector<float>& x, double want_std, const std::string& what) {
  double sum = 0.0, sum_sq = 0.0;
  size_t within_one = 0;
  for (const float v : x) {
    sum += v;
    sum_sq += double(v) * v;
    within_one += std::abs(v) < want_std;
  }
  const double n = static_cast<double>(x.size());
  const double mean = sum / n;
  const double stddev = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_LT(std::abs(mean), 7e-3 * want_std) << what;
  EXPECT_NEAR(stddev / want_std, 1.0, 5e-3) << what;
  EXPECT_NEAR(static_cast<double>(within_one) / n, 0.6827, 3e-3) << what;  // P(|z| < 1)
}

TEST(Init, NormalTensorsHaveTheirStd) {
  const GptConfig medium = gpt_preset("medium").config;
  const Model m = make_gpt(medium);
  const Unit& block = *m[1];
  const std::vector<float> w = initial_weights(1337, block);
  const auto values = [&](const char* name) {
    const TensorSpec& t = find(block, name);
    return std::vector<float>(w.begin() + t.offset, w.begin() + t.offset + t.numel);
  };
  expect_normal(values("h.0.mlp.c_fc.weight"), 0.02, "c_fc");
  // The residual projection: 0.02 / sqrt(2 * 6 layers), 4C x C = the same 589,824 values.
  expect_normal(values("h.0.mlp.c_proj.weight"), 0.02 / std::sqrt(12.0), "mlp.c_proj");
}

TEST(Init, RangesOutsideTheUnitAreRejected) {
  const Model m = make_gpt({.layers = 1, .heads = 1, .embd = 4, .seq_len = 3});
  const Unit& u = *m[1];
  std::vector<float> out(4);
  EXPECT_THROW(initialize_range(1, u, u.numel() - 2, u.numel() + 2, out), InvalidArgument);
  EXPECT_THROW(initialize_range(1, u, 5, 3, out), InvalidArgument);
  EXPECT_THROW(initialize_range(1, u, 0, 3, out), InvalidArgument);  // out holds 4, not 3
}

}  // namespace
}  // namespace zerodp
