// A unit's state layout is what ShardedState allocates and what the planner sums; the entries
// no option enables yet are sized zero, and their arithmetic is the one their users will get.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include "memory/ledger.h"
#include "models/gpt.h"
#include "optim/moments8.h"
#include "train/plan.h"
#include "train/sharded_state.h"
#include "train/state_layout.h"

namespace zerodp {
namespace {

using E = StateEntry;

LayoutPlan plan_at(int stage, Precision p = Precision::kBF16, Offload o = Offload::kNone,
                   bool int8 = false) {
  return layout_plan(stage, p, /*fp32_accumulator=*/false, o, int8);
}

// What a ShardedState charged to its ledger equals the layout's bytes, category by category,
// for every stage, precision, offload and moment representation, ragged ranks included.
TEST(StateLayout, ShardedStateAllocatesWhatTheLayoutSays) {
  const Model model = make_gpt({.layers = 2, .heads = 2, .embd = 64, .seq_len = 16});
  std::vector<uint64_t> numel;
  for (const auto& u : model) numel.push_back(u->numel());
  const UnitTensors tensors = unit_tensors(model);
  for (int stage = 0; stage <= 3; ++stage) {
    for (const Precision p : {Precision::kBF16, Precision::kFP32}) {
      for (const Offload o : {Offload::kNone, Offload::kOptimizer, Offload::kParams}) {
        if (o == Offload::kParams && stage != 3) continue;
        for (const bool int8 : {false, true}) {
          for (const int world : {1, 3}) {
            const LayoutPlan lp = plan_at(stage, p, o, int8);
            const int rank = world - 1;
            const std::string where =
                fmt::format("stage {} {} {} int8 {} rank {} of {}", stage, precision_name(p),
                            offload_name(o), int8, rank, world);
            MemoryLedger ledger(rank);
            const ShardedState state(model, lp, false, false, 7, world, rank, ledger);
            const LayoutBytes want = layout_bytes(lp, numel, &tensors, world, rank);
            for (int c = 0; c < kNumMemCategories; ++c) {
              EXPECT_EQ(ledger.current(static_cast<MemCategory>(c)), want.memory[c])
                  << where << " " << mem_category_name(static_cast<MemCategory>(c));
            }
          }
        }
      }
    }
  }
}

// The model states the planner reports are the layout's, and the layout keeps the ZeRO table:
// 16-bit params and grads, fp32 master and moments, each full or the own range.
TEST(StateLayout, EntriesFollowTheStageTable) {
  const uint64_t tensors[] = {1000, 10};
  const UnitShape unit{.numel = 1010, .tensors = tensors};
  for (int stage = 0; stage <= 3; ++stage) {
    const UnitLayout l = unit_layout(plan_at(stage), unit, 4, 1);
    EXPECT_EQ(l.own, (Range{253, 506})) << stage;
    EXPECT_EQ(l[E::kParams].count, stage == 3 ? 253u : 1010u);
    EXPECT_EQ(l[E::kGrads].count, stage >= 2 ? 253u : 1010u);
    EXPECT_EQ(l[E::kMaster].count, stage >= 1 ? 253u : 1010u);
    EXPECT_EQ(l[E::kParams].bits, 16u);
    EXPECT_EQ(l[E::kMaster].bits, 32u);
    EXPECT_EQ(l[E::kAdamM].count, l[E::kMaster].count);
  }
  // fp32: the params are the master.
  EXPECT_EQ(unit_layout(plan_at(1, Precision::kFP32), unit, 4, 1)[E::kMaster].count, 0u);
  // Offloaded: the file's regions, whole 4 KiB blocks each.
  const UnitLayout off = unit_layout(plan_at(3, Precision::kBF16, Offload::kParams), unit, 4, 1);
  LayoutBytes b;
  b += off;
  EXPECT_EQ(b.file, 4 * kOffloadAlign);  // params, master, adam_m, adam_v: 253 elements each
  EXPECT_EQ(b[MemCategory::kParams], 0u);
  EXPECT_EQ(b[MemCategory::kGrads], 253u * 2);
}

// What all ranks hold together is the sum of every rank's layout, computed without a loop over
// the ranks: with 8-bit moments too, whose blocks no aligned partition splits.
TEST(StateLayout, AllRanksAreTheSumOfEveryRank) {
  const Model model = make_gpt({.layers = 2, .heads = 2, .embd = 64, .seq_len = 16});
  std::vector<uint64_t> numel;
  for (const auto& u : model) numel.push_back(u->numel());
  const UnitTensors tensors = unit_tensors(model);
  for (int stage = 0; stage <= 3; ++stage) {
    for (const UnitTensors* int8 : {static_cast<const UnitTensors*>(nullptr), &tensors}) {
      for (const int world : {1, 3, 7, 64}) {
        StateBytes sum;
        for (int r = 0; r < world; ++r) {
          const StateBytes b = model_state_bytes(numel, world, stage, Precision::kBF16, r, true,
                                                 Offload::kNone, int8);
          sum.params += b.params;
          sum.grads += b.grads;
          sum.master += b.master;
          sum.adam_m += b.adam_m;
          sum.adam_v += b.adam_v;
        }
        const StateBytes all =
            all_ranks_model_state_bytes(numel, world, stage, Precision::kBF16, true, int8);
        const std::string where =
            fmt::format("stage {} world {} int8 {}", stage, world, int8 != nullptr);
        EXPECT_EQ(all.params, sum.params) << where;
        EXPECT_EQ(all.grads, sum.grads) << where;
        EXPECT_EQ(all.master, sum.master) << where;
        EXPECT_EQ(all.adam_m, sum.adam_m) << where;
        EXPECT_EQ(all.adam_v, sum.adam_v) << where;
      }
    }
  }
}

// Every entry that no option enables is zero in a run's layout, whatever the run.
TEST(StateLayout, EntriesNotYetUsedAreSizedZero) {
  TrainConfig c;
  c.int8_moments = true;
  c.islands = 2;
  c.offload = Offload::kOptimizer;
  const uint64_t tensors[] = {8192, 64};
  for (int stage = 0; stage <= 3; ++stage) {
    c.stage = stage;
    const UnitLayout l = unit_layout(layout_plan(c), {.numel = 8256, .tensors = tensors}, 2, 0);
    for (const E e : {E::kMuonMomentum, E::kMasterRemainder, E::kMasterTieBits, E::kCodes4M,
                      E::kCodes4V, E::kScales4M, E::kScales4V, E::kErrorFeedback}) {
      EXPECT_EQ(l[e].bytes(), 0u) << state_entry_spec(e).name << " at stage " << stage;
    }
  }
}

// Muon: each matrix's momentum lives whole on the rank whose range holds its first element;
// Adam keeps the other tensors' moments.
TEST(StateLayout, MuonMomentumSitsAtEachMatrixsOwner) {
  // Two matrices of 300 and 500 and a bias of 20: 820 elements over 4 ranks of 205.
  const uint64_t tensors[] = {300, 500, 20};
  const uint8_t matrix[] = {1, 1, 0};
  const UnitShape unit{.numel = 820, .tensors = tensors, .matrix = matrix};
  LayoutPlan p = plan_at(1);
  p.muon = true;
  uint64_t held = 0;
  for (int r = 0; r < 4; ++r) {
    const UnitLayout l = unit_layout(p, unit, 4, r);
    // Rank 0 holds element 0 (the first matrix), rank 1 element 300 (the second).
    EXPECT_EQ(l[E::kMuonMomentum].count, r == 0 ? 300u : r == 1 ? 500u : 0u) << r;
    EXPECT_EQ(l[E::kMuonMomentum].bits, 32u);
    EXPECT_EQ(state_entry_spec(E::kMuonMomentum).category, MemCategory::kAdamM);
    held += l[E::kMuonMomentum].count;
    // Adam's moments: the bias elements of the rank's range only (800..819 is rank 3's).
    EXPECT_EQ(l[E::kAdamM].count, r == 3 ? 20u : 0u) << r;
  }
  EXPECT_EQ(held, 800u);  // every matrix once
  // Stage 0: every rank updates every matrix.
  p.stage = StagePlan::make(0, AccumulatePolicy::kReduce);
  const UnitLayout all = unit_layout(p, unit, 4, 2);
  EXPECT_EQ(all[E::kMuonMomentum].count, 800u);
  EXPECT_EQ(all[E::kAdamM].count, 20u);
}

// A 16-bit master: the remainder's 2 bytes and a tie bit per element replace the fp32 master
// (2 + 1/8 bytes against 4), rounded up to whole bytes.
TEST(StateLayout, MasterRemainderAndTieBits) {
  LayoutPlan p = plan_at(1);
  p.master_remainder = true;
  const UnitLayout l = unit_layout(p, {.numel = 1001}, 1, 0);
  EXPECT_EQ(l[E::kMaster].count, 0u);
  EXPECT_EQ(l[E::kMasterRemainder].bytes(), 2002u);
  EXPECT_EQ(l[E::kMasterTieBits].bytes(), 126u);  // ceil(1001 / 8)
  LayoutBytes b;
  b += l;
  EXPECT_EQ(b[MemCategory::kMaster], 2002u + 126u);
  // Offloaded, each is a region of the file.
  p.offload = Offload::kOptimizer;
  LayoutBytes f;
  f += unit_layout(p, {.numel = 1001}, 1, 0);
  EXPECT_EQ(f[MemCategory::kMaster], 0u);
  EXPECT_EQ(f.file, 4 * kOffloadAlign);  // remainder, tie bits, adam_m, adam_v
  // fp16 parameters are not the master's top half: no remainder can complete them.
  p.precision = Precision::kFP16;
  EXPECT_THROW((void)unit_layout(p, {.numel = 1001}, 1, 0), std::logic_error);
}

// 4-bit moments: two codes a byte over the quantized tensors, a scale per block of the 8-bit
// moments' grid, the small tensors in fp32.
TEST(StateLayout, FourBitCodesWithBlockScales) {
  const uint64_t tensors[] = {5000, 100};  // quantized (>= kMomentMinNumel), then fp32
  LayoutPlan p = plan_at(0);
  p.moments4 = true;
  const UnitLayout l = unit_layout(p, {.numel = 5100, .tensors = tensors}, 1, 0);
  EXPECT_EQ(l[E::kCodes4M].count, 5000u);
  EXPECT_EQ(l[E::kCodes4M].bytes(), 2500u);
  EXPECT_EQ(l[E::kScales4M].count, (5000 + kMomentBlock - 1) / kMomentBlock);
  EXPECT_EQ(l[E::kAdamM].count, 100u);
  EXPECT_EQ(l[E::kCodesM].count, 0u);
  // Sharded on the block grid: rank 1 of 2 starts on a grid line.
  p.stage = StagePlan::make(1, AccumulatePolicy::kReduce);
  const UnitLayout r1 = unit_layout(p, {.numel = 5100, .tensors = tensors}, 2, 1);
  EXPECT_EQ(r1.own.begin % kMomentBlock, 0u);
  EXPECT_EQ(r1[E::kCodes4M].count + r1[E::kAdamM].count, r1.own.count());
  p.int8_moments = true;
  EXPECT_THROW((void)unit_layout(p, {.numel = 5100, .tensors = tensors}, 1, 0), std::logic_error);
}

// DiLoCo's error feedback: fp32 of the island's own range, charged to outer_state.
TEST(StateLayout, ErrorFeedbackPerIsland) {
  LayoutPlan p = plan_at(3);
  p.error_feedback = true;
  const UnitLayout l = unit_layout(p, {.numel = 1001}, 3, 2);
  EXPECT_EQ(l[E::kErrorFeedback].count, 333u);
  LayoutBytes b;
  b += l;
  EXPECT_EQ(b[MemCategory::kOuterState], 333u * 4);
}

// A checkpoint shard holds the own range of each state it saves, whatever extent the stage
// holds or where the states live: params, master, moments (8-bit: a code per element, the
// block scales, the small tensors' fp32 moments), and on island 0's ranks the outer state. A
// state the layout holds that no checkpoint saves yet is refused, not left out.
TEST(StateLayout, AnOffloadedElementIsTheInFileEntriesBytes) {
  struct Case {
    Precision precision;
    Offload offload;
    bool int8;
    uint64_t bytes, narrowest;
  };
  // 16-bit params 2, fp32 master 4 (at fp32 the params are it), moments 4 + 4 or codes 1 + 1;
  // 8-bit moments' small tensors keep fp32 moments in memory, not in the file.
  const Case cases[] = {
      {Precision::kBF16, Offload::kOptimizer, false, 12, 4},
      {Precision::kBF16, Offload::kParams, false, 14, 2},
      {Precision::kFP32, Offload::kOptimizer, false, 8, 4},
      {Precision::kFP32, Offload::kParams, false, 12, 4},
      {Precision::kFP16, Offload::kOptimizer, true, 6, 1},
      {Precision::kBF16, Offload::kParams, true, 8, 1},
      {Precision::kFP32, Offload::kOptimizer, true, 2, 1},
  };
  for (const Case& c : cases) {
    const OffloadElement e = offload_element(layout_plan(3, c.precision, false, c.offload, c.int8));
    EXPECT_EQ(e.bytes, c.bytes) << precision_name(c.precision) << " " << offload_name(c.offload)
                                << " int8 " << c.int8;
    EXPECT_EQ(e.narrowest, c.narrowest)
        << precision_name(c.precision) << " " << offload_name(c.offload) << " int8 " << c.int8;
  }
  EXPECT_THROW(offload_element(layout_plan(3, Precision::kBF16, false, Offload::kNone, false)),
               std::logic_error);
}

TEST(StateLayout, ACheckpointShardIsTheOwnRangeOfTheSavedStates) {
  const uint64_t tensors[] = {8192, 64};  // quantized (>= kMomentMinNumel), then fp32
  const UnitShape unit{.numel = 8256, .tensors = tensors};
  for (const bool int8 : {false, true}) {
    const ShardUnitBytes s0 =
        checkpoint_shard_bytes(plan_at(0, Precision::kBF16, Offload::kNone, int8), unit, 2, 0,
                               /*outer=*/true, /*pending=*/true);
    const ShardUnitBytes s3 =
        checkpoint_shard_bytes(plan_at(3, Precision::kBF16, Offload::kParams, int8), unit, 2, 0,
                               /*outer=*/false, /*pending=*/false);
    const Range own = own_range(8256, 2, 0, int8 ? kMomentBlock : 1);
    const uint64_t n = own.count();
    const MomentCounts m = moment_counts(tensors, own.begin, own.end);
    EXPECT_EQ(s0.states, int8 ? (2 + 4 + 2) * n + 2 * 4 * (m.blocks + m.fp32) : (2 + 4 + 8) * n)
        << int8;
    EXPECT_EQ(s3.states, s0.states) << int8;
    EXPECT_EQ(s0.outer, 2 * 4 * n) << int8;
    EXPECT_EQ(s0.pending, 4 * n) << int8;
    EXPECT_EQ(s3.outer + s3.pending, 0u) << int8;
  }
  // fp32: the params are the master.
  EXPECT_EQ(checkpoint_shard_bytes(plan_at(1, Precision::kFP32), unit, 2, 1, false, false).states,
            (4 + 8) * own_range(8256, 2, 1).count());
  const uint8_t matrix[] = {1, 0};
  LayoutPlan p = plan_at(1);
  p.muon = true;
  EXPECT_THROW((void)checkpoint_shard_bytes(
                   p, {.numel = 8256, .tensors = tensors, .matrix = matrix}, 2, 0, false, false),
               std::logic_error);
}

}  // namespace
}  // namespace zerodp
