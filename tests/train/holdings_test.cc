// A rank's holdings are what its ledger counts, category by category, in the runs whose
// holdings were added up apart before (islands, in turn, 8-bit moments, HSDP); the budget
// advice sweeps stages and rank counts through them, so it divides by the ranks the run does.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include "core/units.h"
#include "train/forecast.h"
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

// The advice's states per stage are the rows' (estimate prints row_config's forecast), so a
// refusal and its advice divide by the same ranks. The positional advice it replaces divided
// every stage by the world: under HSDP, stage 3's states were 1/16 where a rank holds 1/4; with
// islands, 1/8 where an island of 4 holds 1/4; in turn, one island's where a rank holds two.
TEST(BudgetAdvice, NamesTheStatesOfTheRowsItAdvisesOn) {
  const PlannedModel m{.units = {40'000'000, 24'000'000}, .tensors = {{40'000'000}, {24'000'000}}};
  struct Case {
    const char* what;
    int ranks;
    void (*set)(TrainConfig&);
  };
  const Case cases[] = {
      {"HSDP", 16,
       [](TrainConfig& c) {
         c.launch.comm.node_ranks = 4;
         c.shard_within_node = true;
       }},
      {"islands", 8, [](TrainConfig& c) { c.islands = 2; }},
      {"islands in turn", 8,
       [](TrainConfig& c) {
         c.islands = 2;
         c.islands_in_turn = true;
       }},
      {"8-bit moments", 8, [](TrainConfig& c) { c.int8_moments = true; }},
      {"offload", 8, [](TrainConfig& c) { c.offload = Offload::kOptimizer; }},
  };
  for (const Case& k : cases) {
    TrainConfig c;
    c.accumulate_default = true;
    k.set(c);
    const std::string advice = budget_advice(c, m, k.ranks, 1000);
    for (int stage = 0; stage <= 3; ++stage) {
      const Forecast row = forecast(row_config(c, k.ranks, stage, c.offload), m);
      const std::string named =
          fmt::format(" stage {} {}", stage, format_bytes(static_cast<double>(row.states.total())));
      EXPECT_NE(advice.find(named), std::string::npos)
          << k.what << ": " << named << " in " << advice;
    }
  }
}

// The fewest ranks are a world the run can have: whole nodes, whole islands on whole nodes.
// The positional advice named 60 ranks for 7.5e9 parameters in 2 GB, which --node-ranks 8
// cannot launch; the states fit at 64 and not at 56.
TEST(BudgetAdvice, CountsRanksInWholeNodesAndIslands) {
  const PlannedModel m{.units = {7'500'000'000}};
  TrainConfig c;
  c.accumulate_default = true;
  const uint64_t budget = 2'000'000'000;
  EXPECT_NE(budget_advice(c, m, 8, budget).find("needs at least 60 ranks"), std::string::npos);
  c.launch.comm.node_ranks = 8;
  const std::string nodes = budget_advice(c, m, 8, budget);
  EXPECT_NE(nodes.find("needs at least 64 ranks"), std::string::npos) << nodes;
  const auto states = [&](int ranks) {
    return forecast(row_config(c, ranks, 3, Offload::kNone), m).states.total();
  };
  EXPECT_LE(states(64), budget);
  EXPECT_GT(states(56), budget);
  // 3 islands on nodes of 2: a world of multiples of 6 whose islands are whole nodes or
  // parts of one (an island of 3 ranks astride nodes of 2 is no layout).
  c.launch.comm.node_ranks = 2;
  c.islands = 3;
  const std::string islands = budget_advice(c, m, 6, budget);
  const size_t at = islands.find("needs at least ");
  ASSERT_NE(at, std::string::npos) << islands;
  const int n = std::stoi(islands.substr(at + 15));
  EXPECT_EQ(n % 6, 0) << islands;
  EXPECT_EQ(n / 3 % 2, 0) << islands;
  EXPECT_NO_THROW((void)island_layout(c, n));
  EXPECT_LE(forecast(row_config(c, n, 3, Offload::kNone), m).states.total(), budget);
  EXPECT_GT(forecast(row_config(c, n - 6, 3, Offload::kNone), m).states.total(), budget);
  // 2 islands on nodes of 4: 92 ranks would be islands of 46 astride nodes, which no run can
  // launch and the sweep must not ask about; the answer is islands of whole nodes (60 each).
  c.launch.comm.node_ranks = 4;
  c.islands = 2;
  const std::string two = budget_advice(c, m, 4, budget);
  EXPECT_NE(two.find("needs at least 120 ranks"), std::string::npos) << two;
}

// HSDP shards over a node whatever the node count: the advice says so rather than naming a
// rank count that would not shrink the states.
TEST(BudgetAdvice, UnderHsdpNamesTheNodesRanks) {
  const PlannedModel m{.units = {7'500'000'000}};
  TrainConfig c;
  c.accumulate_default = true;
  c.launch.comm.node_ranks = 4;
  c.shard_within_node = true;
  const std::string advice = budget_advice(c, m, 16, 2'000'000'000);
  EXPECT_NE(advice.find("--shard-within-node shards them over a node's 4 ranks"), std::string::npos)
      << advice;
}

}  // namespace
}  // namespace zerodp
