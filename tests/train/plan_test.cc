// The planner against the ZeRO paper's Table 1 and commonly quoted figures.
#include "train/plan.h"

#include <gtest/gtest.h>

namespace zerodp {
namespace {

// ZeRO paper, Table 1: Φ = 7.5B, N = 64, mixed precision with Adam (K = 12):
// DP 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.88 GB per device.
TEST(Plan, ReproducesTheZeroPaperTableOneRow) {
  const uint64_t phi = 7'500'000'000;
  const uint64_t units[] = {phi};
  const double expected[] = {120e9, 31.40625e9, 16.640625e9, 1.875e9};
  for (int stage = 0; stage <= 3; ++stage) {
    const double got =
        static_cast<double>(max_model_state_bytes(units, 64, stage, Precision::kBF16).total());
    EXPECT_DOUBLE_EQ(got, expected[stage]) << "stage " << stage;
  }
}

// TF6 / the brief: DP stores 16Φ·N over the job, ZeRO-3 16Φ in all and 16Φ/N per rank.
TEST(Plan, DataParallelStoresSixteenPhiTimesNAndStageThreeSixteenPhi) {
  const uint64_t phi = 1'000'003;  // prime: ragged ranges
  const uint64_t units[] = {phi};
  for (int n : {1, 2, 7, 8}) {
    uint64_t dp = 0, z3 = 0;
    for (int r = 0; r < n; ++r) {
      dp += model_state_bytes(units, n, 0, Precision::kBF16, r).total();
      z3 += model_state_bytes(units, n, 3, Precision::kBF16, r).total();
    }
    EXPECT_EQ(dp, 16 * phi * static_cast<uint64_t>(n));
    EXPECT_EQ(z3, 16 * phi);
  }
}

// A commonly quoted figure: ZeRO-1 cuts per-rank states about 2.9x at N = 8 (16Φ vs 4Φ + 12Φ/8).
TEST(Plan, StageOneSavesAboutTwoPointNineTimesAtEightRanks) {
  const uint64_t units[] = {8'000'000};
  const double s0 =
      static_cast<double>(max_model_state_bytes(units, 8, 0, Precision::kBF16).total());
  const double s1 =
      static_cast<double>(max_model_state_bytes(units, 8, 1, Precision::kBF16).total());
  EXPECT_NEAR(s0 / s1, 16.0 / 5.5, 1e-12);
  EXPECT_NEAR(s0 / s1, 2.9, 0.01);
}

// TF4/SE2: stage 3 moves 1.5x the bytes of plain DP per step (two gathers + one
// reduce-scatter against an all-reduce's two halves), not 3x.
TEST(Plan, StageThreeMovesOneAndAHalfTimesTheBytesOfDataParallel) {
  const uint64_t units[] = {4'000'000, 1'000'000};
  const auto dp =
      comm_bytes_per_step(units, 8, 0, Precision::kBF16, 1, AccumulatePolicy::kLocal, false, 0);
  const auto z3 =
      comm_bytes_per_step(units, 8, 3, Precision::kBF16, 1, AccumulatePolicy::kReduce, true, 0);
  EXPECT_DOUBLE_EQ(static_cast<double>(z3.total()) / static_cast<double>(dp.total()), 1.5);
}

}  // namespace
}  // namespace zerodp
