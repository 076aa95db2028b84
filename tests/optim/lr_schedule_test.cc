#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace zerodp {
namespace {

TEST(LrSchedule, ParsesItsNamesAndNamesTheOptionsOnError) {
  EXPECT_EQ(parse_lr_schedule("constant"), LrScheduleKind::kConstant);
  EXPECT_EQ(parse_lr_schedule("cosine"), LrScheduleKind::kCosine);
  EXPECT_EQ(to_string(LrScheduleKind::kCosine), "cosine");
  EXPECT_EQ(parse_lr_schedule(to_string(LrScheduleKind::kConstant)), LrScheduleKind::kConstant);
  try {
    (void)parse_lr_schedule("linear");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'linear'"), std::string::npos) << what;
    EXPECT_NE(what.find("constant, cosine"), std::string::npos) << what;
  }
  EXPECT_THROW((void)parse_lr_schedule("Cosine"), InvalidArgument);
  EXPECT_THROW((void)parse_lr_schedule(""), InvalidArgument);
}

TEST(LrSchedule, ConstantWithoutWarmupIsMaxLrAtEveryStep) {
  const LrSchedule s({.kind = LrScheduleKind::kConstant, .max_lr = 1e-3});
  EXPECT_EQ(s.lr_at(0), 1e-3);
  EXPECT_EQ(s.lr_at(1), 1e-3);
  EXPECT_EQ(s.lr_at(1'000'000), 1e-3);
}

TEST(LrSchedule, WarmupRisesLinearlyAndReachesMaxAtItsLastStep) {
  const LrSchedule s({.kind = LrScheduleKind::kConstant, .max_lr = 1e-3, .warmup_steps = 10});
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-4);  // step 0 already trains: (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.lr_at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1e-3);
  EXPECT_EQ(s.lr_at(10), 1e-3);
  EXPECT_EQ(s.lr_at(500), 1e-3);
}

TEST(LrSchedule, CosineBoundaries) {
  const LrSchedule s(
      {.kind = LrScheduleKind::kCosine, .max_lr = 1e-3, .warmup_steps = 10, .total_steps = 110});
  EXPECT_DOUBLE_EQ(s.min_lr(), 1e-4);          // default: 10% of max
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-4);          // warmup's first step
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1e-3);          // warmup's last step
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);         // decay starts at max
  EXPECT_DOUBLE_EQ(s.lr_at(60), 5.5e-4);       // half way: (max + min) / 2
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-4);        // total_steps: min
  EXPECT_DOUBLE_EQ(s.lr_at(1'000'000), 1e-4);  // past the end: stays at min
  EXPECT_GT(s.lr_at(109), s.lr_at(110));       // the last trained step is still above min
}

TEST(LrSchedule, CosineDecreasesMonotonicallyAfterWarmup) {
  const LrSchedule s(
      {.kind = LrScheduleKind::kCosine, .max_lr = 6e-4, .warmup_steps = 7, .total_steps = 1000});
  for (int64_t step = 7; step < 1000; ++step) {
    ASSERT_LE(s.lr_at(step + 1), s.lr_at(step)) << "step " << step;
  }
  for (int64_t step = 0; step < 6; ++step) {
    ASSERT_LT(s.lr_at(step), s.lr_at(step + 1)) << "step " << step;
  }
  EXPECT_EQ(s.lr_at(6), s.lr_at(7));  // warmup's last step and decay's first are both max
}

TEST(LrSchedule, CosineWithoutWarmupStartsAtMaxAndHonoursAnExplicitMin) {
  const LrSchedule s(
      {.kind = LrScheduleKind::kCosine, .max_lr = 2e-3, .total_steps = 4, .min_lr = 0.0});
  EXPECT_EQ(s.lr_at(0), 2e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(2), 1e-3);
  EXPECT_EQ(s.lr_at(4), 0.0);
}

TEST(LrSchedule, RejectsWhatItCannotHonour) {
  const std::vector<std::pair<LrScheduleConfig, std::string>> bad = {
      {{.kind = LrScheduleKind::kCosine, .warmup_steps = 10, .total_steps = 10},
       "total steps (10) greater than warmup steps (10)"},
      {{.kind = LrScheduleKind::kCosine, .total_steps = 0}, "total steps (0)"},
      {{.max_lr = 1e-3, .min_lr = 2e-3}, "min lr 0.002"},
      {{.max_lr = -1.0}, "max lr -1"},
      {{.warmup_steps = -1}, "warmup steps -1"},
  };
  for (const auto& [config, message] : bad) {
    try {
      LrSchedule s(config);
      ADD_FAILURE() << "expected InvalidArgument: " << message;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  const LrSchedule ok({});
  EXPECT_THROW((void)ok.lr_at(-1), InvalidArgument);
}

}  // namespace
}  // namespace zerodp
