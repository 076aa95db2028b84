// A rank's holdings are what its ledger counts, category by category, in the runs whose
// holdings were added up apart before (islands, in turn, 8-bit moments, HSDP).
#include <gtest/gtest.h>

#include "train/holdings.h"
#include "train/setup.h"
#include "train_testing.h"

namespace zerodp {
namespace {

using testing::run;
using testing::tiny_config;

// Every rank's peaks per category and in all are rank_holdings' for the run's configuration.
void expect_ledger_is_holdings(const TrainResult& r, const std::string& what) {
  const Model model = build_model(r.config);
  const PlannedModel m = planned_model(model);
  for (const auto& rank : r.ranks) {
    const Holdings h = rank_holdings(r.config, m, r.world_size, rank.rank);
    const MemoryLedger::Table want = h.by_category();
    for (int c = 0; c < kNumMemCategories; ++c) {
      EXPECT_EQ(rank.peak[static_cast<size_t>(c)], want[static_cast<size_t>(c)])
          << what << ", rank " << rank.rank << ", "
          << mem_category_name(static_cast<MemCategory>(c));
    }
    EXPECT_EQ(rank.peak_total, h.memory()) << what << ", rank " << rank.rank;
  }
}

TEST(Holdings, AreTheLedgersWithIslandsInTurnAndEightBitMoments) {
  TrainConfig c = tiny_config(2, 1);
  c.islands = 2;
  c.islands_in_turn = true;
  c.int8_moments = true;
  c.outer_every = 2;
  c.steps = 2;
  expect_ledger_is_holdings(run(c), "2 islands in turn, int8, stage 1");
}

TEST(Holdings, AreTheLedgersWithIslandsOnRanksOfTheirOwn) {
  TrainConfig c = tiny_config(4, 2);
  c.islands = 2;
  c.outer_every = 2;
  c.outer_quant = 8;
  c.steps = 2;
  expect_ledger_is_holdings(run(c), "2 islands of 2, stage 2, outer int8");
}

TEST(Holdings, AreTheLedgersUnderHsdp) {
  TrainConfig c = tiny_config(4, 3);
  c.launch.comm.node_ranks = 2;
  c.shard_within_node = true;
  c.invariant = false;
  expect_ledger_is_holdings(run(c), "HSDP over nodes of 2, stage 3");
}

}  // namespace
}  // namespace zerodp
