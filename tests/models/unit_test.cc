// Unit::add_tensor: the flat-buffer bookkeeping every model relies on.
#include "models/unit.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace zerodp {
namespace {

// A unit with no computation, to reach the protected add_tensor.
class SpecOnlyUnit final : public Unit {
 public:
  SpecOnlyUnit() : Unit("spec") {}
  using Unit::add_tensor;
  size_t input_count(const BatchShape&) const override { return 0; }
  size_t output_count(const BatchShape&) const override { return 0; }
  size_t saved_count(const BatchShape&) const override { return 0; }
  size_t scratch_count(const BatchShape&) const override { return 0; }
  void forward(std::span<const float>, std::span<const float>, std::span<float>, std::span<float>,
               std::span<float>, const MicroBatch&) override {}
  void backward(std::span<const float>, std::span<const float>, std::span<const float>,
                std::span<const float>, std::span<float>, std::span<float>, std::span<float>,
                const MicroBatch&) override {}
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

}  // namespace
}  // namespace zerodp
