// Unit::add_tensor, the flat-buffer bookkeeping every model relies on, and the buffer-length
// contract Unit::forward/backward check before any unit's own code runs.
#include "models/unit.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "tensor/dtype.h"
#include "tensor/gemm.h"

namespace zerodp {
namespace {

// A unit with no computation, to reach the protected add_tensor.
class SpecOnlyUnit final : public Unit {
 public:
  SpecOnlyUnit() : Unit("spec") {}
  using Unit::add_tensor;
  size_t input_count(const BatchShape&) const override { return 0; }
  size_t output_count(const BatchShape&) const override { return 0; }
  size_t saved_count(const BatchShape&, GemmCompute) const override { return 0; }
  size_t scratch_count(const BatchShape&) const override { return 0; }

 protected:
  void do_forward(std::span<const float>, GemmCompute, std::span<const float>, std::span<float>,
                  std::span<float>, std::span<float>, const MicroBatch&) override {}
  void do_backward(std::span<const float>, GemmCompute, std::span<const float>,
                   std::span<const float>, std::span<const float>, std::span<float>,
                   std::span<float>, std::span<float>, const MicroBatch&) override {}
};

TEST(UnitAddTensor, AppendsAtTheEndOfTheFlatBuffer) {
  SpecOnlyUnit u;
  u.add_tensor("a.weight", {3, 5}, InitKind::kNormal, 0.1f, true);
  u.add_tensor("a.bias", {3}, InitKind::kZeros, 0.0f, false);
  u.add_tensor("b.weight", {2, 1, 7}, InitKind::kOnes, 0.0f, false);
  ASSERT_EQ(u.tensors().size(), 3u);
  EXPECT_EQ(u.tensors()[0].offset, 0u);
  EXPECT_EQ(u.tensors()[0].numel, 15u);
  EXPECT_EQ(u.tensors()[1].offset, 15u);
  EXPECT_EQ(u.tensors()[1].numel, 3u);
  EXPECT_EQ(u.tensors()[2].offset, 18u);
  EXPECT_EQ(u.tensors()[2].numel, 14u);
  EXPECT_EQ(u.numel(), 32u);
  EXPECT_EQ(u.tensors()[0].init_std, 0.1f);
  EXPECT_FALSE(u.tensors()[1].weight_decay);
  EXPECT_EQ(u.tensors()[2].init, InitKind::kOnes);
}

TEST(UnitAddTensor, RejectsDuplicateNamesAndEmptyShapes) {
  SpecOnlyUnit u;
  u.add_tensor("w", {4}, InitKind::kZeros, 0.0f, false);
  EXPECT_THROW(u.add_tensor("w", {4}, InitKind::kZeros, 0.0f, false), InvalidArgument);
  EXPECT_THROW(u.add_tensor("x", {}, InitKind::kZeros, 0.0f, false), InvalidArgument);
  EXPECT_THROW(u.add_tensor("y", {4, 0}, InitKind::kZeros, 0.0f, false), InvalidArgument);
  EXPECT_THROW(u.add_tensor("z", {4}, InitKind::kNormal, -1.0f, true), InvalidArgument);
  EXPECT_EQ(u.numel(), 4u) << "a rejected tensor leaves the buffer as it was";
}

// ---------------------------------------------------------------- the length contract

// Checks nothing itself and counts the calls that reach its hooks, so every rejection below
// is Unit's. Per sample: in 2, out 3 (or 1 in all as a head), saved 4, scratch 5; 6 weights.
class UncheckedUnit final : public Unit {
 public:
  explicit UncheckedUnit(bool head = false) : Unit("unchecked"), head_(head) {
    add_tensor("w", {6}, InitKind::kZeros, 0.0f, false);
  }
  size_t input_count(const BatchShape& s) const override { return 2 * rows(s); }
  size_t output_count(const BatchShape& s) const override { return head_ ? 1 : 3 * rows(s); }
  size_t saved_count(const BatchShape& s, GemmCompute) const override { return 4 * rows(s); }
  size_t scratch_count(const BatchShape& s) const override { return 5 * rows(s); }

  int forwards = 0;
  int backwards = 0;
  GemmCompute compute_seen = GemmCompute::kFP32;

 protected:
  void do_forward(std::span<const float>, GemmCompute compute, std::span<const float>,
                  std::span<float>, std::span<float>, std::span<float>,
                  const MicroBatch&) override {
    ++forwards;
    compute_seen = compute;
  }
  void do_backward(std::span<const float>, GemmCompute compute, std::span<const float>,
                   std::span<const float>, std::span<const float>, std::span<float>,
                   std::span<float>, std::span<float>, const MicroBatch&) override {
    ++backwards;
    compute_seen = compute;
  }

 private:
  static size_t rows(const BatchShape& s) { return static_cast<size_t>(s.B * s.T); }
  bool head_;
};

// Buffers of the lengths the contract asks for at (B=2, T=1); a test shortens one.
struct Buffers {
  explicit Buffers(const Unit& u, const BatchShape& s)
      : w(u.numel()),
        in(u.input_count(s)),
        out(u.output_count(s)),
        saved(u.saved_count(s, GemmCompute::kFP32)),
        scratch(u.scratch_count(s)),
        dout(u.output_count(s)),
        dw(u.numel()),
        din(u.input_count(s)) {}
  std::vector<float> w, in, out, saved, scratch, dout, dw, din;
};

MicroBatch batch() {
  MicroBatch mb;
  mb.shape = {.B = 2, .T = 1};
  return mb;
}

// The message of the InvalidArgument `call` throws, or "" when it throws none.
template <typename F>
std::string rejection(F call) {
  try {
    call();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

void forward(UncheckedUnit& u, Buffers& b, const MicroBatch& mb) {
  u.forward(UnitWeights::fp32(b.w), b.in, b.out, b.saved, b.scratch, mb);
}
void backward(UncheckedUnit& u, Buffers& b, const MicroBatch& mb) {
  u.backward(UnitWeights::fp32(b.w), b.in, b.saved, b.dout, b.dw, b.din, b.scratch, mb);
}

TEST(UnitContract, ForwardRejectsEachWrongLengthBeforeTheUnitRuns) {
  const MicroBatch mb = batch();
  UncheckedUnit u;
  const struct {
    const char* name;
    std::vector<float> Buffers::*buffer;
    size_t length;
    const char* needs;
  } cases[] = {
      {"w", &Buffers::w, 5, "needs 6"},
      {"in", &Buffers::in, 3, "needs 4"},
      {"out", &Buffers::out, 7, "needs 6"},
      {"saved", &Buffers::saved, 7, "needs 8"},
      {"saved", &Buffers::saved, 9, "needs 8"},
      {"scratch", &Buffers::scratch, 9, "needs at least 10"},
  };
  for (const auto& c : cases) {
    Buffers b(u, mb.shape);
    (b.*c.buffer).resize(c.length);
    EXPECT_EQ(rejection([&] { forward(u, b, mb); }),
              fmt::format("unit unchecked forward: {} holds {} elements; (B=2, T=1) {}", c.name,
                          c.length, c.needs));
  }
  EXPECT_EQ(u.forwards, 0) << "a rejected call must not reach the unit";
  Buffers b(u, mb.shape);
  b.scratch.resize(50);  // a shared workspace may be longer
  EXPECT_EQ(rejection([&] { forward(u, b, mb); }), "");
  EXPECT_EQ(u.forwards, 1);
}

TEST(UnitContract, BackwardRejectsEachWrongLengthBeforeTheUnitRuns) {
  const MicroBatch mb = batch();
  UncheckedUnit u;
  const struct {
    const char* name;
    std::vector<float> Buffers::*buffer;
    size_t length;
    const char* needs;
  } cases[] = {
      {"w", &Buffers::w, 7, "needs 6"},
      {"in", &Buffers::in, 0, "needs 4"},
      {"saved", &Buffers::saved, 7, "needs 8"},
      {"dout", &Buffers::dout, 0, "needs 6"},  // only a head's dout may be empty
      {"dout", &Buffers::dout, 5, "needs 6"},
      {"dw", &Buffers::dw, 5, "needs 6"},
      {"din", &Buffers::din, 5, "needs 4"},
      {"scratch", &Buffers::scratch, 0, "needs at least 10"},
  };
  for (const auto& c : cases) {
    Buffers b(u, mb.shape);
    (b.*c.buffer).resize(c.length);
    EXPECT_EQ(rejection([&] { backward(u, b, mb); }),
              fmt::format("unit unchecked backward: {} holds {} elements; (B=2, T=1) {}", c.name,
                          c.length, c.needs));
  }
  EXPECT_EQ(u.backwards, 0) << "a rejected call must not reach the unit";
  Buffers b(u, mb.shape);
  EXPECT_EQ(rejection([&] { backward(u, b, mb); }), "");
  EXPECT_EQ(u.backwards, 1);
}

TEST(UnitContract, AHeadsDoutMayBeEmptyOrOneElement) {
  const MicroBatch mb = batch();
  UncheckedUnit head(/*head=*/true);
  Buffers b(head, mb.shape);
  ASSERT_EQ(b.dout.size(), 1u);
  EXPECT_EQ(rejection([&] { backward(head, b, mb); }), "");
  b.dout.clear();
  EXPECT_EQ(rejection([&] { backward(head, b, mb); }), "");
  b.dout.resize(2);
  EXPECT_EQ(rejection([&] { backward(head, b, mb); }),
            "unit unchecked backward: dout holds 2 elements; (B=2, T=1) needs 1");
  EXPECT_EQ(head.backwards, 2);
}

TEST(UnitContract, AStoredBf16CopyHoldsEveryWeightOrNone) {
  const MicroBatch mb = batch();
  UncheckedUnit u;
  Buffers b(u, mb.shape);
  const std::vector<BFloat16> whole(6), part(5);
  const auto with = [&](std::span<const BFloat16> stored) {
    return rejection([&] {
      u.forward(UnitWeights{.values = b.w, .stored_bf16 = stored, .compute = GemmCompute::kBF16},
                b.in, b.out, b.saved, b.scratch, mb);
    });
  };
  EXPECT_EQ(with(whole), "");
  EXPECT_EQ(u.compute_seen, GemmCompute::kBF16) << "the compute reaches the unit";
  EXPECT_EQ(with({}), "");
  EXPECT_EQ(with(part),
            "unit unchecked forward: w.stored_bf16 holds 5 elements; the unit's 6 weights need 6 "
            "or none");
  EXPECT_EQ(u.forwards, 2);
}

// out (B, 2) = in (B, 3) @ w^T (2, 3) through gemm in the compute it is given; no scope of its
// own, so what its product reads shows whether Unit::forward opened one.
class ProductUnit final : public Unit {
 public:
  ProductUnit() : Unit("product") {
    add_tensor("w", {2, 3}, InitKind::kNormal, 0.02f, true, TensorUse::kProductOperand);
  }
  size_t input_count(const BatchShape& s) const override { return 3 * size_t(s.B); }
  size_t output_count(const BatchShape& s) const override { return 2 * size_t(s.B); }
  size_t saved_count(const BatchShape&, GemmCompute) const override { return 0; }
  size_t scratch_count(const BatchShape&) const override { return 0; }

 protected:
  void do_forward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                  std::span<float> out, std::span<float>, std::span<float>,
                  const MicroBatch& mb) override {
    gemm(compute, Transpose::kNo, Transpose::kYes, size_t(mb.shape.B), 2, 3, 1.0f, in, 3, w, 3,
         0.0f, out, 2);
  }
  void do_backward(std::span<const float>, GemmCompute, std::span<const float>,
                   std::span<const float>, std::span<const float>, std::span<float>,
                   std::span<float>, std::span<float>, const MicroBatch&) override {}
};

// bf16 products read a unit's weight operands from the stored copy the caller gives: a copy
// of zeros (not the values' rounding, which only a test would give) zeroes the product.
TEST(UnitContract, Bf16ProductsReadTheStoredCopyWithoutTheCallerOpeningAScope) {
  if (!gemm_bf16_native()) GTEST_SKIP() << "the fp32 fallback rounds its operands itself";
  ProductUnit u;
  MicroBatch mb;
  mb.shape = {.B = 2, .T = 1};
  const std::vector<float> w(6, 1.0f), in(6, 1.0f);
  const std::vector<BFloat16> zeros(6);
  std::vector<float> out(4);
  u.forward(UnitWeights{.values = w, .stored_bf16 = zeros, .compute = GemmCompute::kBF16}, in, out,
            {}, {}, mb);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  u.forward(UnitWeights{.values = w, .stored_bf16 = zeros, .compute = GemmCompute::kFP32}, in, out,
            {}, {}, mb);
  for (float x : out) EXPECT_EQ(x, 3.0f) << "fp32 products read the values";
}

}  // namespace
}  // namespace zerodp
