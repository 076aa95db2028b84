// World-size invariance (docs/determinism.md): with the canonical gradient order, a run of M
// micro-batches per step gives the same bits on every rank count N dividing M (A = M / N
// micro-batches per rank), at every stage and precision: the same weights, step losses,
// gradient norms and validation loss. Clipping is active on every step, so the norm's bits
// reach the weights.
#include <gtest/gtest.h>

#include <fmt/core.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint/consolidate.h"
#include "core/error.h"
#include "temp_dir.h"
#include "train_testing.h"

namespace zerodp {
namespace {

using testing::file_bytes;
using testing::run;
using testing::tiny_config;

constexpr int kMicroBatches = 12;

TrainConfig invariant_config(int ranks, int stage, Precision precision) {
  TrainConfig c = tiny_config(ranks, stage, precision);
  c.micro_batch = 2;
  c.grad_accum = kMicroBatches / ranks;
  c.accumulate = AccumulatePolicy::kReduce;
  c.invariant = true;
  c.clip = 0.05f;
  c.steps = 3;
  // Ragged over most N: 5 validation batches on 2, 3, 4, 6 or 12 ranks.
  c.eval_batches = 5;
  return c;
}

struct Outcome {
  std::string weights;
  std::vector<double> losses, norms, clipped;
  double val_loss = 0;
};

Outcome outcome_of(const TrainResult& r) {
  Outcome o;
  o.weights = r.weights_sha256;
  for (const StepRecord& s : r.steps) {
    o.losses.push_back(s.loss);
    o.norms.push_back(s.grad_norm);
    o.clipped.push_back(s.grad_norm_clipped);
  }
  o.val_loss = r.val_loss.value_or(std::nan(""));
  return o;
}

void expect_same(const Outcome& want, const Outcome& got, const std::string& where) {
  EXPECT_EQ(got.weights, want.weights) << where;
  EXPECT_EQ(got.losses, want.losses) << where;
  EXPECT_EQ(got.norms, want.norms) << where;
  EXPECT_EQ(got.val_loss, want.val_loss) << where;
}

class Invariance : public ::testing::TestWithParam<Precision> {};

TEST_P(Invariance, EveryDivisorOfTheMicroBatchesAndEveryStageGivesTheSameBits) {
  const Precision p = GetParam();
  const Outcome want = outcome_of(run(invariant_config(1, 0, p)));
  for (size_t k = 0; k < want.norms.size(); ++k) {
    ASSERT_LT(want.clipped[k], want.norms[k]) << "clipping must act on step " << k + 1;
  }
  for (int stage = 0; stage <= 3; ++stage) {
    for (int n : {1, 2, 3, 4, 6, 12}) {
      if (stage == 0 && n == 1) continue;
      const std::string where =
          fmt::format("{} stage {} N={} A={}", precision_name(p), stage, n, kMicroBatches / n);
      expect_same(want, outcome_of(run(invariant_config(n, stage, p))), where);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, Invariance,
                         ::testing::Values(Precision::kBF16, Precision::kFP16, Precision::kFP32),
                         [](const ::testing::TestParamInfo<Precision>& p) {
                           return std::string(precision_name(p.param));
                         });

// The llama family keeps the contract as the gpt does: its blocked head, RoPE, grouped-query
// sharing and SwiGLU depend on no rank count or stage.
class LlamaInvariance : public ::testing::TestWithParam<Precision> {};

TEST_P(LlamaInvariance, EveryStageAndDivisorGivesTheSameBits) {
  const Precision p = GetParam();
  const auto llama = [&](int n, int stage) {
    TrainConfig c = invariant_config(n, stage, p);
    c.model = "llama";
    return c;
  };
  const Outcome want = outcome_of(run(llama(1, 0)));
  EXPECT_NE(want.losses.front(), want.losses.back()) << "a model that did not move agrees";
  for (int stage = 0; stage <= 3; ++stage) {
    for (int n : {2, 3, 4, 12}) {
      expect_same(want, outcome_of(run(llama(n, stage))),
                  fmt::format("llama {} stage {} N={}", precision_name(p), stage, n));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, LlamaInvariance,
                         ::testing::Values(Precision::kBF16, Precision::kFP16, Precision::kFP32),
                         [](const ::testing::TestParamInfo<Precision>& p) {
                           return std::string(precision_name(p.param));
                         });

// 8-bit moments (optim/moments8.h) keep it: their blocks lie on the unit's grid and the
// partitions are cut on it, so no rank count or stage changes a block or its scale.
TEST(Invariance, Int8MomentsGiveTheSameBitsOnEveryDivisorAndStage) {
  TrainConfig c = invariant_config(1, 0, Precision::kBF16);
  c.int8_moments = true;
  const Outcome want = outcome_of(run(c));
  c.int8_moments = false;
  EXPECT_NE(outcome_of(run(c)).weights, want.weights) << "the moments' precision must matter";
  for (int stage = 0; stage <= 3; ++stage) {
    for (int n : {2, 3, 4, 12}) {
      TrainConfig k = invariant_config(n, stage, Precision::kBF16);
      k.int8_moments = true;
      expect_same(want, outcome_of(run(k)), fmt::format("int8 stage {} N={}", stage, n));
    }
  }
}

// One rank accumulating 8 micro-batches is 8 ranks with one each, for every model kind.
TEST(Invariance, OneRankTimesEightEqualsEightRanksTimesOne) {
  for (const char* model : {"gpt", "llama", "mlp"}) {
    TrainConfig one = invariant_config(1, 2, Precision::kBF16);
    one.model = model;
    one.grad_accum = 8;
    TrainConfig eight = one;
    eight.launch.ranks = 8;
    eight.grad_accum = 1;
    expect_same(outcome_of(run(one)), outcome_of(run(eight)), model);
  }
}

// The test above would catch an order that depends on N: a rank's micro-batches summed
// first (--accumulate local) gives other bits on 2 and 4 ranks.
TEST(Invariance, ALocalPreSumIsNotInvariant) {
  TrainConfig two = invariant_config(2, 1, Precision::kBF16);
  two.accumulate = AccumulatePolicy::kLocal;
  two.invariant = false;
  TrainConfig four = two;
  four.launch.ranks = 4;
  four.grad_accum = kMicroBatches / 4;
  EXPECT_NE(run(two).weights_sha256, run(four).weights_sha256);
}

// A checkpoint written on 4 ranks continues on 3, 2 and 6 (the micro-batches per rank
// derived, not given) as if nothing had happened: the uninterrupted run's losses and
// weights, and an export byte for byte the same.
TEST(Invariance, AResumeOnAnyDivisorContinuesTheUninterruptedRun) {
  namespace fs = std::filesystem;
  testing::TempDir tmp;
  TrainConfig base = invariant_config(4, 1, Precision::kBF16);
  base.steps = 5;
  base.checkpoint_dir = (tmp.path() / "whole").string();
  const TrainResult whole = run(base);
  checkpoint::export_fp32(base.checkpoint_dir, tmp.path() / "whole.safetensors");
  TrainConfig first = base;
  first.checkpoint_dir = (tmp.path() / "first").string();
  first.stop_after = 2;
  (void)run(first);
  for (int n : {3, 2, 6}) {
    const std::string where = fmt::format("resumed on {} ranks", n);
    const fs::path dir = tmp.path() / fmt::format("on{}", n);
    fs::copy(first.checkpoint_dir, dir, fs::copy_options::recursive);
    TrainConfig next = base;
    next.launch.ranks = n;
    next.stage = n == 6 ? 3 : 1;  // any stage loads any other's checkpoint
    next.grad_accum = 0;          // derived: 12 / n
    next.checkpoint_dir = dir.string();
    next.resume = "latest";
    const TrainResult r = run(next);
    EXPECT_EQ(r.config.grad_accum, kMicroBatches / n) << where;
    EXPECT_EQ(r.weights_sha256, whole.weights_sha256) << where;
    ASSERT_EQ(r.steps.size(), 3u) << where;
    for (size_t k = 0; k < r.steps.size(); ++k) {
      EXPECT_EQ(r.steps[k].loss, whole.steps[k + 2].loss) << where << " step " << k + 3;
      EXPECT_EQ(r.steps[k].grad_norm, whole.steps[k + 2].grad_norm) << where;
    }
    const fs::path out = tmp.path() / fmt::format("on{}.safetensors", n);
    checkpoint::export_fp32(dir, out);
    EXPECT_EQ(file_bytes(out), file_bytes(tmp.path() / "whole.safetensors")) << where;
  }
  // 5 ranks cannot split 12 micro-batches: refused, naming the counts that can.
  TrainConfig five = base;
  five.launch.ranks = 5;
  five.grad_accum = 0;
  five.checkpoint_dir = (tmp.path() / "on5").string();
  fs::copy(first.checkpoint_dir, five.checkpoint_dir, fs::copy_options::recursive);
  five.resume = "latest";
  try {
    (void)run(five);
    ADD_FAILURE() << "5 ranks accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("use --ranks 1, 2, 3, 4, 6, 12"), std::string::npos)
        << e.what();
  }
}

// --invariant on with a local pre-sum is refused, naming why.
TEST(Invariance, OnWithLocalAccumulationIsRefused) {
  TrainConfig c = invariant_config(2, 0, Precision::kBF16);
  c.accumulate = AccumulatePolicy::kLocal;
  try {
    (void)run(c);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--invariant on needs --accumulate reduce"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zerodp
