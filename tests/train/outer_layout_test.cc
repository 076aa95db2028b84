// The outer step's buffers are outer_layout's, the planner's: OuterStep allocates by it and
// refuses to start when its own fragment pieces give other sizes, so a run in every shape of
// the outer state (fragments, quantized exchanges, islands in turn, the offloaded master
// gathered at stage 0) starts only where the two agree, and its ledger is the layout's bytes.
#include <gtest/gtest.h>

#include <fmt/core.h>

#include <string>
#include <vector>

#include "temp_dir.h"
#include "train/outer_layout.h"
#include "train/setup.h"
#include "train_testing.h"

namespace zerodp {
namespace {

using testing::run;
using testing::tiny_config;

// 2 islands, rounds of 4 steps so that every fragment count here divides them; the run's
// last step ends every fragment's round at once, so one step exchanges them all.
TrainConfig outer_config(int ranks, int stage, int fragments, int quant) {
  TrainConfig c = tiny_config(ranks, stage);
  c.islands = 2;
  c.outer_every = 4;
  c.fragments = fragments;
  c.outer_quant = quant;
  c.steps = 1;
  c.eval_every = 0;
  return c;
}

// Every rank's ledger holds outer_layout's bytes of outer state (these options enable no
// per-island entry of the state layout), and the layout has the shape the case names.
void expect_ledger_is_layout(const TrainConfig& c, const std::string& what,
                             bool whole_master = false) {
  const TrainResult r = run(c);  // OuterStep throws where its pieces differ from the layout
  const Model model = build_model(r.config);
  std::vector<uint64_t> units;
  for (const auto& u : model) units.push_back(u->numel());
  ASSERT_EQ(r.ranks.size(), static_cast<size_t>(r.world_size)) << what;
  for (const auto& rank : r.ranks) {
    const OuterLayout l = outer_layout(units, island_layout(r.config, r.world_size), rank.rank);
    const std::string at = fmt::format("{}, rank {}", what, rank.rank);
    EXPECT_EQ(rank.peak[static_cast<size_t>(MemCategory::kOuterState)], l.bytes()) << at;
    EXPECT_EQ(l.fragments.size(), static_cast<size_t>(c.fragments)) << at;
    EXPECT_EQ(l.payload > 0, c.outer_quant != 0) << at;
    EXPECT_EQ(l.whole_master > 0, whole_master) << at;
  }
}

TEST(OuterLayout, IsWhatTheOuterStepAllocatesInEveryShape) {
  for (int fragments : {1, 2, 4}) {
    for (int quant : {0, 8, 4}) {
      expect_ledger_is_layout(outer_config(4, 1, fragments, quant),
                              fmt::format("2 islands of 2, F {}, int{}", fragments, quant));
    }
  }
  for (int quant : {0, 4}) {
    TrainConfig c = outer_config(2, 1, 2, quant);
    c.islands_in_turn = true;
    expect_ledger_is_layout(c, fmt::format("2 islands in turn, F 2, int{}", quant));
  }
  TrainConfig int8 = outer_config(4, 2, 4, 8);
  int8.int8_moments = true;  // own ranges cut on the moments' blocks
  expect_ledger_is_layout(int8, "8-bit moments, stage 2, F 4, int8");
  testing::TempDir tmp;
  for (int quant : {0, 8}) {
    TrainConfig c = outer_config(4, 0, 2, quant);
    c.offload = Offload::kOptimizer;
    c.offload_dir = tmp.path().string();
    expect_ledger_is_layout(c, fmt::format("stage 0 bf16 offloaded, F 2, int{}", quant), true);
  }
}

// Units of 1000 and 600 elements, fragments [0, 800) and [800, 1600), rank 3 (island 1's
// second rank) owning [500, 1000) and [300, 600) of them: fragment 0 holds 300 of its
// elements in blocks 1-3 of 256, fragment 1 the 200 of block 0 and 300 in blocks 1-3.
TEST(OuterLayout, SumsItsBuffers) {
  const std::vector<uint64_t> units{1000, 600};
  IslandLayout l{.islands = 2, .fragments = 2, .ranks = 2, .quant_bits = 8};
  OuterLayout o = outer_layout(units, l, 3);
  EXPECT_EQ(o.own, (std::vector<uint64_t>{500, 300}));
  ASSERT_EQ(o.fragments.size(), 2u);
  EXPECT_EQ(o.fragments[0],
            (OuterFragment{.count = 300, .blocks = 4, .touched = 3, .payload = 312}));
  EXPECT_EQ(o.fragments[1],
            (OuterFragment{.count = 500, .blocks = 4, .touched = 4, .payload = 516}));
  EXPECT_EQ(o.exchange, 500u);
  EXPECT_EQ(o.amax, 4u);
  EXPECT_EQ(o.codes, 500u);
  EXPECT_EQ(o.payload, 516u);
  EXPECT_EQ(o.gathered, 2 * 516u);
  EXPECT_EQ(o.whole_master, 0u);
  EXPECT_EQ(o.bytes(), 4 * (2 * 800 + 500 + 4) + 500 + 516 + 2 * 516u);

  // int4 packs two codes a byte; the master gathered whole is the largest unit's.
  l.quant_bits = 4;
  l.gathers_master = true;
  l.master_offloaded = true;
  o = outer_layout(units, l, 3);
  EXPECT_EQ(o.fragments[1].payload, 4 * 4 + 250u);
  EXPECT_EQ(o.gathered, 2 * 266u);
  EXPECT_EQ(o.whole_master, 1000u);
  EXPECT_EQ(o.bytes(), 4 * (2 * 800 + 500 + 1000 + 4) + 500 + 266 + 2 * 266u);

  // Unquantized: the global weights, momentum and exchange only.
  l.quant_bits = 0;
  l.master_offloaded = false;
  o = outer_layout(units, l, 3);
  EXPECT_EQ(o.bytes(), 4 * (2 * 800 + 500u));
  l.islands = 1;
  EXPECT_EQ(outer_layout(units, l, 1).bytes(), 0u);
}

TEST(OuterLayout, NamesTheFirstSizeThatDiffers) {
  const std::vector<uint64_t> units{1000, 600};
  const IslandLayout l{.islands = 2, .fragments = 2, .ranks = 2, .quant_bits = 8};
  const OuterLayout want = outer_layout(units, l, 3);
  EXPECT_EQ(outer_layout_difference(want, want), "");
  OuterLayout got = want;
  got.fragments[1].payload += 1;
  got.gathered += 2;
  EXPECT_EQ(outer_layout_difference(want, got), "fragment 1's payload: 517, not 516");
  got = want;
  got.own.pop_back();
  EXPECT_EQ(outer_layout_difference(want, got), "units: 1, not 2");
}

}  // namespace
}  // namespace zerodp
