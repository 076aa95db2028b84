#include "optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"

namespace zerodp {
namespace {

constexpr float k2_16 = 65536.0f;

// One row: a config, a sequence of verdicts ('.' clean, 'X' overflow), and the scale after
// each of them. Every overflow must be skipped and every clean step applied.
struct Row {
  std::string name;
  LossScalerConfig config;
  std::string events;
  std::vector<float> scales;
};

std::vector<Row> rows() {
  const LossScalerConfig fast{.growth_interval = 3};
  const LossScalerConfig hyst2{.growth_interval = 3, .hysteresis = 2};
  const LossScalerConfig hyst3{.growth_interval = 4, .hysteresis = 3};
  const float s = k2_16;
  return {
      {"clean steps keep the scale until the interval", fast, "..", {s, s}},
      {"growth interval of clean steps doubles", fast, "...", {s, s, 2 * s}},
      {"each interval doubles again", fast, "......", {s, s, 2 * s, 2 * s, 2 * s, 4 * s}},
      {"overflow halves", fast, "X", {s / 2}},
      {"consecutive overflows halve each time", fast, "XXX", {s / 2, s / 4, s / 8}},
      {"overflow restarts the clean count", fast, "..X...", {s, s, s / 2, s / 2, s / 2, s}},
      {"growth after halving", fast, "X...X", {s / 2, s / 2, s / 2, s, s / 2}},
      {"halving stops at the minimum, steps still skipped",
       {.initial_scale = 4, .min_scale = 1, .growth_interval = 3},
       "XXXX.",
       {2, 1, 1, 1, 1}},
      {"doubling stops at the maximum",
       {.initial_scale = 8388608.0f, .max_scale = 16777216.0f, .growth_interval = 1},
       "...X.",
       {16777216.0f, 16777216.0f, 16777216.0f, 8388608.0f, 16777216.0f}},
      {"hysteresis 2 tolerates the first overflow", hyst2, "X", {s}},
      {"hysteresis 2 halves at the second overflow", hyst2, "XX", {s, s / 2}},
      {"exhausted hysteresis halves at every further overflow",
       hyst2,
       "XXXX",
       {s, s / 2, s / 4, s / 8}},
      {"clean steps do not refill hysteresis, growth does",
       hyst2,
       "X.X...X.X",
       {s, s, s / 2, s / 2, s / 2, s, s, s, s / 2}},
      {"hysteresis counts overflows that are not consecutive", hyst3, "X.X.X", {s, s, s, s, s / 2}},
  };
}

TEST(LossScaler, FollowsTheSpecTable) {
  for (const Row& row : rows()) {
    SCOPED_TRACE(row.name + " [" + row.events + "]");
    ASSERT_EQ(row.events.size(), row.scales.size());
    LossScaler scaler(row.config);
    EXPECT_EQ(scaler.scale(), row.config.initial_scale);
    for (size_t i = 0; i < row.events.size(); ++i) {
      const bool overflow = row.events[i] == 'X';
      const StepAction action = scaler.update(overflow);
      EXPECT_EQ(action, overflow ? StepAction::kSkip : StepAction::kApply) << "event " << i;
      EXPECT_EQ(scaler.scale(), row.scales[i]) << "after event " << i;
    }
  }
}

TEST(LossScaler, DefaultsAre2To16Start2000StepGrowthNoHysteresis) {
  const LossScalerConfig c;
  EXPECT_EQ(c.initial_scale, 65536.0f);
  EXPECT_EQ(c.min_scale, 1.0f);
  EXPECT_EQ(c.max_scale, 16777216.0f);
  EXPECT_EQ(c.growth_interval, 2000);
  EXPECT_EQ(c.hysteresis, 1);
  LossScaler scaler(c);
  for (int i = 0; i < 1999; ++i) ASSERT_EQ(scaler.update(false), StepAction::kApply);
  EXPECT_EQ(scaler.scale(), 65536.0f);
  EXPECT_EQ(scaler.state().clean_steps, 1999);
  (void)scaler.update(false);
  EXPECT_EQ(scaler.scale(), 131072.0f);
  EXPECT_EQ(scaler.state().clean_steps, 0);
}

TEST(LossScaler, ReportsWhenItIsAtTheMinimum) {
  LossScaler scaler({.initial_scale = 2, .min_scale = 1});
  EXPECT_FALSE(scaler.at_min_scale());
  (void)scaler.update(true);
  EXPECT_TRUE(scaler.at_min_scale());
  EXPECT_EQ(scaler.update(true), StepAction::kSkip);
  EXPECT_EQ(scaler.scale(), 1.0f);
}

TEST(LossScaler, InverseScaleIsExact) {
  LossScaler scaler({});
  EXPECT_EQ(scaler.inverse_scale(), 1.0f / 65536.0f);
  EXPECT_EQ(scaler.inverse_scale() * scaler.scale(), 1.0f);
}

TEST(LossScaler, SavedStateRestoresAndContinuesIdentically) {
  const LossScalerConfig config{.growth_interval = 5, .hysteresis = 3};
  const std::string events = "..X.X....X..XXX.......X..X.........";
  for (size_t cut = 0; cut <= events.size(); ++cut) {
    LossScaler original(config);
    for (size_t i = 0; i < cut; ++i) (void)original.update(events[i] == 'X');
    const LossScalerState saved = original.state();  // a plain copy, as a checkpoint holds
    LossScaler restored(config, saved);
    EXPECT_EQ(restored.state(), saved);
    for (size_t i = cut; i < events.size(); ++i) {
      const bool overflow = events[i] == 'X';
      ASSERT_EQ(original.update(overflow), restored.update(overflow));
      ASSERT_EQ(original.state(), restored.state()) << "cut " << cut << " event " << i;
    }
  }
}

TEST(LossScaler, InitialStateIsTheConfigsStart) {
  const LossScaler scaler({.initial_scale = 1024, .hysteresis = 4});
  EXPECT_EQ(scaler.state(),
            (LossScalerState{.scale = 1024, .clean_steps = 0, .hysteresis_left = 4}));
}

TEST(LossScaler, RejectsConfigsItCannotHonour) {
  const std::vector<std::pair<LossScalerConfig, std::string>> bad = {
      {{.initial_scale = 1000}, "initial scale 1000 is not a power of two"},
      {{.min_scale = 0}, "min scale 0"},
      {{.max_scale = std::numeric_limits<float>::infinity()}, "max scale inf"},
      {{.initial_scale = 0.5f}, "min scale 1 <= initial scale 0.5"},
      {{.initial_scale = 33554432.0f}, "<= max scale 16777216"},
      {{.growth_interval = 0}, "growth interval 0"},
      {{.hysteresis = 0}, "hysteresis 0"},
  };
  for (const auto& [config, message] : bad) {
    try {
      LossScaler scaler(config);
      ADD_FAILURE() << "expected InvalidArgument: " << message;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

TEST(LossScaler, RejectsRestoredStatesTheConfigCannotReach) {
  const LossScalerConfig config{.growth_interval = 10, .hysteresis = 2};
  const std::vector<std::pair<LossScalerState, std::string>> bad = {
      {{.scale = 3, .hysteresis_left = 1}, "scale 3"},
      {{.scale = 0.5f, .hysteresis_left = 1}, "scale 0.5"},
      {{.scale = 33554432.0f, .hysteresis_left = 1}, "scale 33554432"},
      {{.scale = std::nanf(""), .hysteresis_left = 1}, "scale nan"},
      {{.clean_steps = 10, .hysteresis_left = 1}, "clean steps 10"},
      {{.clean_steps = -1, .hysteresis_left = 1}, "clean steps -1"},
      {{.hysteresis_left = 0}, "hysteresis left 0"},
      {{.hysteresis_left = 3}, "hysteresis left 3"},
  };
  for (const auto& [state, message] : bad) {
    try {
      LossScaler scaler(config, state);
      ADD_FAILURE() << "expected InvalidArgument: " << message;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

TEST(AllFinite, AcceptsEmptyFiniteExtremesAndSubnormals) {
  EXPECT_TRUE(all_finite({}));
  const std::vector<float> x = {0.0f,
                                -0.0f,
                                1.0f,
                                std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::lowest(),
                                std::numeric_limits<float>::denorm_min(),
                                65504.0f};
  EXPECT_TRUE(all_finite(x));
}

TEST(AllFinite, FindsAnInfOrNaNAnywhere) {
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), -std::nanf("")};
  for (const size_t n : {1u, 7u, 16u, 37u, 1000u}) {
    for (const size_t at : {size_t{0}, n / 2, n - 1}) {
      for (const float special : specials) {
        std::vector<float> x(n, 1.5f);
        x[at] = special;
        EXPECT_FALSE(all_finite(x)) << "n " << n << " at " << at << " value " << special;
      }
    }
  }
}

}  // namespace
}  // namespace zerodp
