// Training-engine behaviour: data parallelism averages, fp16 overflow skips, loss falls,
// budgets are enforced.
#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>

#include "core/error.h"
#include "train_testing.h"

namespace zerodp {
namespace {

using testing::run;
using testing::tiny_config;

// SE9: N ranks with micro-batch b see the same global batch as 1 rank with batch N*b, and
// the averaged gradient is the same up to summation order. fp32, so the only difference is
// the order of floating-point sums (per-rank means, then the mean over ranks).
TEST(DataParallel, NRanksTimesBatchBTrainLikeOneRankWithBatchNB) {
  for (int n : {2, 4}) {
    TrainConfig one = tiny_config(1, 0, Precision::kFP32);
    one.micro_batch = 8;
    one.steps = 5;
    one.clip = 0;
    one.keep_final_weights = true;
    TrainConfig many = one;
    many.launch.ranks = n;
    many.micro_batch = 8 / n;
    const TrainResult a = run(one);
    const TrainResult b = run(many);
    ASSERT_EQ(a.steps.size(), b.steps.size());
    for (size_t i = 0; i < a.steps.size(); ++i) {
      EXPECT_NEAR(b.steps[i].loss, a.steps[i].loss, 1e-5 * std::fabs(a.steps[i].loss))
          << "N=" << n << " step " << i + 1;
    }
    // Weights: Adam divides by sqrt(v), so a gradient difference of an ulp moves a weight by
    // up to ~lr per step where v is tiny; after 5 steps of lr 1e-3 every weight must agree
    // within 5e-4 of an initial scale of 0.02, and the typical one far closer.
    ASSERT_EQ(a.final_weights.size(), b.final_weights.size());
    double max_diff = 0, sum_diff = 0;
    for (size_t i = 0; i < a.final_weights.size(); ++i) {
      const double d = std::fabs(a.final_weights[i] - b.final_weights[i]);
      max_diff = std::max(max_diff, d);
      sum_diff += d;
    }
    EXPECT_LT(max_diff, 5e-4) << "N=" << n;
    EXPECT_LT(sum_diff / static_cast<double>(a.final_weights.size()), 1e-5) << "N=" << n;
    // And the consumed samples are the same global batches.
    EXPECT_NE(a.weights_sha256, "");
  }
}

TEST(MixedPrecision, Fp16OverflowSkipsTheStepOnEveryRankAndHalvesTheScale) {
  std::string stage0_hash;
  for (int stage : {0, 3}) {
    TrainConfig c = tiny_config(2, stage, Precision::kFP16);
    c.initial_loss_scale = 16777216.0f;  // 2^24: dlogits overflow fp16 at once
    c.steps = 10;
    const TrainResult r = run(c);
    int skipped = 0;
    for (size_t i = 0; i < r.steps.size(); ++i) {
      const auto& s = r.steps[i];
      ASSERT_TRUE(s.loss_scale.has_value());
      if (s.skipped) {
        ++skipped;
        if (i + 1 < r.steps.size()) {
          EXPECT_EQ(*r.steps[i + 1].loss_scale, *s.loss_scale / 2);
        }
      }
    }
    EXPECT_GE(skipped, 1);
    EXPECT_LT(skipped, 10) << "the scale never came down far enough to train";
    EXPECT_FALSE(r.steps.back().skipped);
    // If one rank had skipped alone, stage 0's replicas would disagree with stage 3's shards.
    if (stage == 0) {
      stage0_hash = r.weights_sha256;
    } else {
      EXPECT_EQ(r.weights_sha256, stage0_hash);
    }
  }
}

TEST(Training, LossFallsOnTheKjvText) {
  if (!std::filesystem::exists("/usr/bin/bible")) GTEST_SKIP() << "bible-kjv is not installed";
  TrainConfig c = tiny_config(2, 0);
  c.data = "kjv";
  c.steps = 40;
  c.lr = 3e-3f;
  c.micro_batch = 8;
  const TrainResult r = run(c);
  EXPECT_NEAR(r.steps.front().loss, std::log(256.0), 0.1);
  EXPECT_LT(r.steps.back().loss, r.steps.front().loss - 1.0);
  ASSERT_TRUE(r.val_loss.has_value());
  EXPECT_LT(*r.val_loss, r.steps.front().loss - 1.0);
}

TEST(Training, SamplesAreDisjointAcrossRanksAndTheSameForEveryStage) {
  const TrainResult a = run(tiny_config(3, 0));
  const TrainResult b = run(tiny_config(3, 3));
  ASSERT_EQ(a.ranks.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(a.ranks[r].samples_sha256, b.ranks[r].samples_sha256);
  EXPECT_NE(a.ranks[0].samples_sha256, a.ranks[1].samples_sha256);
}

TEST(MemoryBudget, AnAllocationPastTheBudgetFailsNamingRankAndCategory) {
  TrainConfig c = tiny_config(2, 0);
  c.memory_per_rank = 200 * 1024;  // the tiny model's states alone need ~670 KiB
  try {
    (void)run(c);
    FAIL() << "the run fit a budget it cannot fit";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank "), std::string::npos) << what;
    EXPECT_NE(what.find("--memory-per-rank budget of 200.00 KiB"), std::string::npos) << what;
  }
}

// A budget that stage 3 on 4 ranks fits exactly (measured without a budget first) refuses
// stage 0, naming what would fit, and lets stage 3 train.
TEST(MemoryBudget, StageZeroIsRefusedWithAdviceWhereStageThreeTrains) {
  TrainConfig c = tiny_config(4, 3);
  c.micro_batch = 1;
  const TrainResult free3 = run(c);
  uint64_t need3 = 0;
  for (const auto& r : free3.ranks) need3 = std::max(need3, r.peak_total);
  c.memory_per_rank = need3;
  const TrainResult fits = run(c);
  EXPECT_EQ(fits.weights_sha256, free3.weights_sha256);
  c.stage = 0;
  try {
    (void)run(c);
    FAIL() << "stage 0 fit a budget sized for stage 3";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("stage 3"), std::string::npos) << what;
    EXPECT_NE(what.find("(fits)"), std::string::npos) << what;
    EXPECT_NE(what.find("never changes stage"), std::string::npos) << what;
  }
}

TEST(Config, RejectsBadValuesNamingThem) {
  auto expect_error = [](TrainConfig c, const std::string& needle) {
    try {
      (void)run(c);
      ADD_FAILURE() << "accepted a config that should fail with " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TrainConfig c = tiny_config(2, 0);
  c.stage = 4;
  expect_error(c, "--stage 4");
  c = tiny_config(2, 0);
  c.size = "huge";
  expect_error(c, "huge");
  c = tiny_config(0, 0);
  expect_error(c, "--ranks 0");
  c = tiny_config(2, 0);
  c.micro_batch = -1;
  expect_error(c, "--micro-batch -1");
  c = tiny_config(2, 0);
  c.heads = 5;
  expect_error(c, "5");
}

}  // namespace
}  // namespace zerodp
