// The planner's per-rank functions cost O(units) whatever the world size, so that estimate
// and train's preflight stay linear in the ranks: checked against a reference built from
// Partition (O(world) per unit) for many (world, rank) pairs, and at a world too large for
// any per-rank table.
#include <algorithm>
#include <climits>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/partition.h"
#include "models/gpt.h"
#include "train/plan.h"

namespace zerodp {
namespace {

// The straightforward computation: every unit's own range from a full Partition.
StateBytes reference_states(std::span<const uint64_t> units, int world, int stage,
                            Precision precision, int rank) {
  const Sharding sh = Sharding::for_stage(stage);
  const uint64_t w = precision == Precision::kFP32 ? 4 : 2;
  StateBytes b;
  for (uint64_t numel : units) {
    const uint64_t own = Partition(numel, world).count(rank);
    const uint64_t opt = sh.optimizer_states ? own : numel;
    b.params += (sh.parameters ? own : numel) * w;
    b.grads += (sh.gradients ? own : numel) * w;
    b.master += precision == Precision::kFP32 ? 0 : opt * 4;
    b.adam_m += opt * 4;
    b.adam_v += opt * 4;
  }
  return b;
}

void expect_equal(const StateBytes& got, const StateBytes& want, const std::string& what) {
  EXPECT_EQ(got.params, want.params) << what;
  EXPECT_EQ(got.grads, want.grads) << what;
  EXPECT_EQ(got.master, want.master) << what;
  EXPECT_EQ(got.adam_m, want.adam_m) << what;
  EXPECT_EQ(got.adam_v, want.adam_v) << what;
}

// Ragged units: smaller than, equal to and larger than the world, primes and powers of two.
const std::vector<uint64_t> kUnits = {1, 2, 3, 7, 64, 1000, 1'000'003, 7'500'000'000};

TEST(PlanScale, PerRankStatesAndCommMatchThePartitionForEveryRank) {
  for (int world : {1, 2, 3, 5, 7, 8, 13, 64, 100, 1001}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (Precision p : {Precision::kBF16, Precision::kFP32}) {
        StateBytes sum;
        for (int rank = 0; rank < world; ++rank) {
          const std::string what =
              fmt::format("world {} rank {} stage {} {}", world, rank, stage, precision_name(p));
          const StateBytes got = model_state_bytes(kUnits, world, stage, p, rank);
          expect_equal(got, reference_states(kUnits, world, stage, p, rank), what);
          sum.params += got.params;
          sum.grads += got.grads;
          sum.master += got.master;
          sum.adam_m += got.adam_m;
          sum.adam_v += got.adam_v;
          // Comm: all-gather brings every range but mine, reduce-scatter my range from
          // each peer.
          const CommBytes c = comm_bytes_per_step(kUnits, world, stage, p, 2,
                                                  AccumulatePolicy::kReduce, false, rank);
          const uint64_t w = p == Precision::kFP32 ? 4 : 2;
          uint64_t rs = 0, ag = 0;
          for (uint64_t numel : kUnits) {
            const uint64_t own = Partition(numel, world).count(rank);
            rs += static_cast<uint64_t>(world - 1) * own * w;
            ag += (numel - own) * w;
          }
          if (stage == 0) {
            EXPECT_EQ(c.all_reduce, 2 * (rs + ag)) << what;
          } else {
            EXPECT_EQ(c.reduce_scatter, 2 * rs) << what;
            EXPECT_EQ(c.all_gather, (stage == 3 ? 4 : 1) * ag) << what;
          }
        }
        expect_equal(all_ranks_model_state_bytes(kUnits, world, stage, p), sum,
                     fmt::format("all ranks, world {} stage {}", world, stage));
      }
    }
  }
}

TEST(PlanScale, TransientCommBuffersFollowTheRanksOwnRange) {
  const Model model = make_gpt({.layers = 2, .heads = 2, .embd = 32, .seq_len = 16, .vocab = 11});
  for (int world : {1, 3, 7, 64, 5000}) {
    for (int rank = 0; rank < world; rank += std::max(1, world / 50)) {
      uint64_t max_own = 0;
      for (const auto& u : model) {
        max_own = std::max<uint64_t>(max_own, Partition(u->numel(), world).count(rank));
      }
      const TransientPlan plan{.world = world,
                               .stage = 2,
                               .precision = Precision::kBF16,
                               .policy = AccumulatePolicy::kReduce,
                               .seq_len = 16};
      EXPECT_EQ(transient_bytes(model, plan, rank).comm_buffers, 2 * max_own * 2)
          << "world " << world << " rank " << rank;
    }
  }
}

// No per-rank table: a world of 2^31 - 1 ranks would need 16 GiB of offsets per unit.
TEST(PlanScale, LargestWorldNeedsNoPerRankTable) {
  const uint64_t units[] = {7'500'000'000};
  const int world = INT_MAX;
  // 7.5e9 = 3 x (2^31 - 1) + 1057549059: the first ranks hold 4 elements, the last 3.
  EXPECT_EQ(model_state_bytes(units, world, 3, Precision::kBF16, 0).total(), 4u * 16);
  EXPECT_EQ(model_state_bytes(units, world, 3, Precision::kBF16, world - 1).total(), 3u * 16);
  EXPECT_EQ(all_ranks_model_state_bytes(units, world, 3, Precision::kBF16).total(),
            7'500'000'000u * 16);
  EXPECT_EQ(comm_bytes_per_step(units, world, 3, Precision::kBF16, 1, AccumulatePolicy::kReduce,
                                false, world - 1)
                .all_gather,
            2 * (7'500'000'000u - 3) * 2);
  const Model model = make_gpt({.layers = 1, .heads = 1, .embd = 8, .seq_len = 4, .vocab = 5});
  const TransientPlan plan{.world = world,
                           .stage = 1,
                           .precision = Precision::kBF16,
                           .policy = AccumulatePolicy::kReduce,
                           .seq_len = 4};
  EXPECT_EQ(transient_bytes(model, plan, world - 1).comm_buffers, 0u);
}

TEST(PlanScale, RefusesRanksOutsideTheWorld) {
  const uint64_t units[] = {10};
  EXPECT_THROW(model_state_bytes(units, 4, 0, Precision::kBF16, 4), InvalidArgument);
  EXPECT_THROW(model_state_bytes(units, 0, 0, Precision::kBF16, 0), InvalidArgument);
  EXPECT_THROW(all_ranks_model_state_bytes(units, 0, 0, Precision::kBF16), InvalidArgument);
}

// The canonical order with A > 1 keeps its fp32 accumulator in the grads buffer at stages
// 2-3 (4 bytes per owned element, nothing in grad_accum) and beside the full 16-bit grads
// at stages 0-1 (grad_accum, 4 bytes per owned element).
TEST(PlanScale, TheCanonicalAccumulatorIsTheGradsBufferAtStagesTwoAndThree) {
  const std::vector<uint64_t> units = {1000, 37, 4097};
  const Model model = make_gpt({.layers = 1, .heads = 2, .embd = 16, .seq_len = 8, .vocab = 11});
  std::vector<uint64_t> gpt;
  for (const auto& u : model) gpt.push_back(u->numel());
  for (int world : {1, 3, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      uint64_t own = 0, gpt_own = 0;
      for (uint64_t n : units) own += Partition(n, world).count(rank);
      for (uint64_t n : gpt) gpt_own += Partition(n, world).count(rank);
      for (int stage = 0; stage <= 3; ++stage) {
        const std::string what = fmt::format("world {} rank {} stage {}", world, rank, stage);
        const StateBytes plain = model_state_bytes(units, world, stage, Precision::kBF16, rank);
        const StateBytes acc = model_state_bytes(units, world, stage, Precision::kBF16, rank, true);
        EXPECT_EQ(acc.grads, stage >= 2 ? 4 * own : plain.grads) << what;
        EXPECT_EQ(acc.total() - acc.grads, plain.total() - plain.grads) << what;
        const TransientPlan p{.world = world,
                              .stage = stage,
                              .precision = Precision::kBF16,
                              .policy = AccumulatePolicy::kReduce,
                              .grad_accum = 2,
                              .canonical = true,
                              .micro_batch = 1,
                              .seq_len = 8};
        EXPECT_EQ(transient_bytes(model, p, rank).grad_accum, stage >= 2 ? 0 : 4 * gpt_own) << what;
      }
    }
  }
}

}  // namespace
}  // namespace zerodp
