// The heart of zerodp: every stage gives the same bits, and its memory and communication
// equal the ZeRO formulas exactly.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include "models/gpt.h"
#include "train/plan.h"
#include "train/report.h"
#include "train_testing.h"

namespace zerodp {
namespace {

using testing::run;
using testing::tiny_config;

struct MatrixCase {
  int ranks;
  Precision precision;
  int grad_accum;
  AccumulatePolicy policy;
};

std::string describe(const MatrixCase& c) {
  return fmt::format("N={} {} A={} {}", c.ranks, precision_name(c.precision), c.grad_accum,
                     accumulate_name(c.policy));
}

void PrintTo(const MatrixCase& c, std::ostream* os) { *os << describe(c); }

class StagesAgree : public ::testing::TestWithParam<MatrixCase> {};

TEST_P(StagesAgree, WeightsAreBitIdenticalAtEveryStage) {
  const MatrixCase m = GetParam();
  std::string reference;
  std::vector<double> reference_losses;
  for (int run_index = 0; run_index < 8; ++run_index) {
    const int stage = run_index % 4;
    const bool checkpoint = run_index >= 4;
    TrainConfig c = tiny_config(m.ranks, stage, m.precision);
    c.grad_accum = m.grad_accum;
    c.accumulate = m.policy;
    c.checkpoint_activations = checkpoint;
    const TrainResult r = run(c);
    ASSERT_EQ(r.weights_sha256.size(), 64u);
    std::vector<double> losses;
    for (const auto& s : r.steps) losses.push_back(s.loss);
    if (run_index == 0) {
      reference = r.weights_sha256;
      reference_losses = losses;
      // A model that did not move would agree trivially.
      EXPECT_NE(r.steps.front().loss, r.steps.back().loss) << describe(m);
    } else {
      EXPECT_EQ(r.weights_sha256, reference)
          << describe(m) << " stage " << stage << (checkpoint ? " checkpointed" : "");
      EXPECT_EQ(losses, reference_losses)
          << describe(m) << " stage " << stage << (checkpoint ? " checkpointed" : "");
    }
  }
}

std::vector<MatrixCase> matrix() {
  std::vector<MatrixCase> cases;
  for (int n = 1; n <= 4; ++n) {
    for (Precision p : {Precision::kBF16, Precision::kFP16, Precision::kFP32}) {
      cases.push_back({n, p, 1, AccumulatePolicy::kLocal});
      cases.push_back({n, p, 2, AccumulatePolicy::kLocal});
      cases.push_back({n, p, 2, AccumulatePolicy::kReduce});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Matrix, StagesAgree, ::testing::ValuesIn(matrix()),
                         [](const ::testing::TestParamInfo<MatrixCase>& p) {
                           const MatrixCase& c = p.param;
                           return fmt::format("N{}_{}_A{}_{}", c.ranks, precision_name(c.precision),
                                              c.grad_accum, accumulate_name(c.policy));
                         });

// Model-state bytes per rank: the ZeRO paper's table, for ragged partitions.
TEST(StageAccounting, ModelStateBytesEqualTheZeroFormulaPerRank) {
  for (int n : {1, 3, 4}) {
    for (Precision p : {Precision::kBF16, Precision::kFP32}) {
      for (int stage = 0; stage <= 3; ++stage) {
        const TrainResult r = run(tiny_config(n, stage, p));
        const Sharding sh = Sharding::for_stage(stage);
        const bool fp32 = p == Precision::kFP32;
        const uint64_t w = fp32 ? 4 : 2;
        uint64_t sum_params = 0;
        for (const auto& rank : r.ranks) {
          // What this rank owns, summed over units (ranges are ragged).
          uint64_t own = 0;
          for (uint64_t numel : r.unit_numel) own += Partition(numel, n).count(rank.rank);
          const uint64_t full = r.params;
          auto at = [&](MemCategory c) { return rank.model_state[static_cast<int>(c)]; };
          const std::string where =
              fmt::format("N={} {} stage {} rank {}", n, precision_name(p), stage, rank.rank);
          EXPECT_EQ(at(MemCategory::kParams), (sh.parameters ? own : full) * w) << where;
          EXPECT_EQ(at(MemCategory::kGrads), (sh.gradients ? own : full) * w) << where;
          const uint64_t opt = sh.optimizer_states ? own : full;
          EXPECT_EQ(at(MemCategory::kMaster), fp32 ? 0 : opt * 4) << where;
          EXPECT_EQ(at(MemCategory::kAdamM), opt * 4) << where;
          EXPECT_EQ(at(MemCategory::kAdamV), opt * 4) << where;
          sum_params += at(MemCategory::kParams);
          // The planner predicts the ledger exactly.
          const StateBytes plan = model_state_bytes(r.unit_numel, n, stage, p, rank.rank);
          EXPECT_EQ(plan.params, at(MemCategory::kParams)) << where;
          EXPECT_EQ(plan.grads, at(MemCategory::kGrads)) << where;
          EXPECT_EQ(plan.master, at(MemCategory::kMaster)) << where;
          EXPECT_EQ(plan.adam_m + plan.adam_v, at(MemCategory::kAdamM) + at(MemCategory::kAdamV))
              << where;
        }
        // Summed over ranks: Φ·w·N replicated, Φ·w sharded.
        EXPECT_EQ(sum_params, r.params * w * (sh.parameters ? 1 : static_cast<uint64_t>(n)));
      }
    }
  }
}

// --optimizer-states int8: per rank the ledger holds, for each tensor's part of its optimizer
// range, one byte per element and an fp32 scale per block of the unit's 256-element grid
// (tensors under 4096 elements fp32), in partitions cut on that grid, as the planner says;
// the comm of the steps too (the report's formula table). A GPT small's moments shrink to
// about a quarter.
TEST(StageAccounting, Int8MomentsAreCountedExactly) {
  for (int n : {1, 3, 4}) {
    for (int stage = 0; stage <= 3; ++stage) {
      TrainConfig c = tiny_config(n, stage);
      c.int8_moments = true;
      const TrainResult r = run(c);
      ASSERT_FALSE(r.unit_tensors.empty());
      for (const auto& rank : r.ranks) {
        auto at = [&](MemCategory k) { return rank.model_state[static_cast<int>(k)]; };
        const std::string where = fmt::format("N={} stage {} rank {}", n, stage, rank.rank);
        const StateBytes plan = model_state_bytes(r.unit_numel, n, stage, c.precision, rank.rank,
                                                  false, Offload::kNone, &r.unit_tensors);
        EXPECT_EQ(plan.params, at(MemCategory::kParams)) << where;
        EXPECT_EQ(plan.grads, at(MemCategory::kGrads)) << where;
        EXPECT_EQ(plan.master, at(MemCategory::kMaster)) << where;
        EXPECT_EQ(plan.adam_m, at(MemCategory::kAdamM)) << where;
        EXPECT_EQ(plan.adam_v, at(MemCategory::kAdamV)) << where;
        EXPECT_EQ(formula_table(r).find("DIFF"), std::string::npos) << where;
      }
    }
  }
  const Model gpt = make_gpt({.layers = 12, .heads = 12, .embd = 768, .seq_len = 256});
  std::vector<uint64_t> numel;
  for (const auto& u : gpt) numel.push_back(u->numel());
  const UnitTensors tensors = unit_tensors(gpt);
  const StateBytes fp32 = model_state_bytes(numel, 4, 1, Precision::kBF16, 0);
  const StateBytes int8 =
      model_state_bytes(numel, 4, 1, Precision::kBF16, 0, false, Offload::kNone, &tensors);
  const double ratio = static_cast<double>(int8.adam_m) / static_cast<double>(fp32.adam_m);
  EXPECT_GT(ratio, 0.25);  // a byte per element and the scales
  EXPECT_LT(ratio, 0.26);
}

// Comm bytes of the training steps, summed over ranks, equal the formulas of docs/zero.md
// and docs/determinism.md.
TEST(StageAccounting, CommBytesPerStepEqualTheFormulas) {
  struct Mode {
    AccumulatePolicy policy;
    bool canonical;
  };
  for (int n : {2, 3}) {
    for (int a : {1, 2}) {
      for (Mode mode :
           {Mode{AccumulatePolicy::kLocal, false}, Mode{AccumulatePolicy::kReduce, false},
            Mode{AccumulatePolicy::kReduce, true}}) {
        const AccumulatePolicy policy = mode.policy;
        for (int stage = 0; stage <= 3; ++stage) {
          TrainConfig c = tiny_config(n, stage);
          c.grad_accum = a;
          c.accumulate = policy;
          c.invariant = mode.canonical;
          const TrainResult r = run(c);
          const uint64_t steps = r.steps.size();
          const uint64_t w = 2;
          const uint64_t phi = r.params;
          const uint64_t units = r.unit_numel.size();
          const uint64_t a_red = policy == AccumulatePolicy::kReduce ? a : 1;
          const uint64_t ring = static_cast<uint64_t>(n - 1) * phi * w;
          CommLedger::Table sum{};
          for (const auto& rank : r.ranks) {
            for (int k = 0; k < kNumCommKinds; ++k) {
              sum[k].calls += rank.comm_train[k].calls;
              sum[k].bytes += rank.comm_train[k].bytes;
            }
          }
          auto get = [&](CommKind k) { return sum[static_cast<int>(k)]; };
          const std::string where =
              fmt::format("N={} A={} {}{} stage {}", n, a, accumulate_name(policy),
                          mode.canonical ? " canonical" : "", stage);
          uint64_t ar = 0, rs = 0, ag = 0;
          if (stage == 0 && mode.canonical && a > 1) {
            // A reduce-scatters into the owners' accumulators, one gather of the average.
            rs = static_cast<uint64_t>(a) * ring;
            ag = ring;
          } else if (stage == 0) {
            ar = a_red * 2 * ring;
          } else if (stage <= 2) {
            rs = a_red * ring;
            ag = ring;
          } else {
            rs = a_red * ring;
            ag = 2 * static_cast<uint64_t>(a) * ring;
          }
          EXPECT_EQ(get(CommKind::kAllReduce).bytes, ar * steps) << where;
          EXPECT_EQ(get(CommKind::kReduceScatter).bytes, rs * steps) << where;
          EXPECT_EQ(get(CommKind::kAllGather).bytes, ag * steps) << where;
          EXPECT_EQ(get(CommKind::kBroadcast).bytes, 0u) << where;
          // The planner's per-rank prediction, rank by rank.
          for (const auto& rank : r.ranks) {
            const CommBytes plan = comm_bytes_per_step(r.unit_numel, n, stage, Precision::kBF16, a,
                                                       policy, mode.canonical, rank.rank);
            EXPECT_EQ(rank.comm_train[static_cast<int>(CommKind::kAllReduce)].bytes,
                      plan.all_reduce * steps)
                << where;
            EXPECT_EQ(rank.comm_train[static_cast<int>(CommKind::kReduceScatter)].bytes,
                      plan.reduce_scatter * steps)
                << where;
            EXPECT_EQ(rank.comm_train[static_cast<int>(CommKind::kAllGather)].bytes,
                      plan.all_gather * steps)
                << where;
          }
          // Calls: one per unit per collective.
          EXPECT_EQ(get(CommKind::kAllReduce).calls, (ar ? a_red : 0) * units * n * steps) << where;
          // One control exchange per step: norm, overflow flag and loss.
          EXPECT_EQ(get(CommKind::kControl).calls, static_cast<uint64_t>(n) * steps) << where;
        }
      }
    }
  }
}

TEST(StageAccounting, StageThreeHoldsAtMostTheUnitInUsePlusPrefetchGathered) {
  for (int prefetch : {0, 1, 2}) {
    TrainConfig c = tiny_config(2, 3);
    c.prefetch = prefetch;
    const TrainResult r = run(c);
    uint64_t largest = 0;
    for (uint64_t numel : r.unit_numel) largest = std::max(largest, numel);
    for (const auto& rank : r.ranks) {
      EXPECT_LE(rank.peak[static_cast<int>(MemCategory::kGathered)],
                (1 + static_cast<uint64_t>(prefetch)) * largest * 2)
          << "prefetch " << prefetch;
      EXPECT_GT(rank.peak[static_cast<int>(MemCategory::kGathered)], 0u);
    }
  }
}

TEST(ActivationCheckpointing, KeepsOnlyUnitInputsAndRecomputes) {
  for (int stage : {0, 3}) {
    TrainConfig c = tiny_config(2, stage);
    const TrainResult plain = run(c);
    c.checkpoint_activations = true;
    const TrainResult checkpointed = run(c);
    const auto act = [](const TrainResult& r) {
      return r.ranks[0].peak[static_cast<int>(MemCategory::kActivations)];
    };
    // tiny: 2 blocks, each saving far more than its input; one recompute buffer replaces them.
    EXPECT_LT(act(checkpointed), act(plain) * 6 / 10) << "stage " << stage;
    EXPECT_EQ(checkpointed.weights_sha256, plain.weights_sha256);
    // Stage 3 gathers a unit once for its recompute and its backward: comm is unchanged.
    EXPECT_EQ(checkpointed.ranks[0].comm_train, plain.ranks[0].comm_train);
  }
}

TEST(StageAccounting, OneRankHasNoCommAndAllStagesHoldTheSame) {
  for (int stage = 0; stage <= 3; ++stage) {
    const TrainResult r = run(tiny_config(1, stage));
    for (int k = 0; k < kNumCommKinds; ++k) {
      if (static_cast<CommKind>(k) == CommKind::kControl) continue;
      EXPECT_EQ(r.ranks[0].comm_train[k].bytes, 0u) << "stage " << stage;
    }
    EXPECT_EQ(r.ranks[0].model_state[static_cast<int>(MemCategory::kParams)], r.params * 2);
  }
}

}  // namespace
}  // namespace zerodp
