// What a rank holds, as the parts that iterate it see it: the islands a rank holds
// (train/held_islands.h) and the two stores its states stream from (train/state_store.h,
// train/offload.h), which hand out the same values in the same shapes, and the offload file,
// which is the state layout's.
#include <gtest/gtest.h>

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory/ledger.h"
#include "temp_dir.h"
#include "train/config.h"
#include "train/held_islands.h"
#include "train/offload.h"
#include "train/plan.h"
#include "train/setup.h"
#include "train/sharded_state.h"
#include "train/state_store.h"
#include "train_testing.h"

namespace zerodp {
namespace {

TrainConfig int8_config() {
  TrainConfig c = testing::tiny_config(1, 0);
  c.int8_moments = true;
  resolve_config(c);
  return c;
}

ShardedState states(const Model& model, const TrainConfig& c, MemoryLedger& ledger,
                    Offload offload = Offload::kNone) {
  return ShardedState(model, StagePlan::make(c.stage, c.accumulate), c.precision, false,
                      c.decay_all, c.seed, 1, 0, ledger, offload, c.int8_moments);
}

// Island v's units are told apart by where their parameters live.
std::vector<const void*> params_of(const ShardedState& s) {
  std::vector<const void*> out;
  for (const UnitState& u : s.units()) out.push_back(u.params.data());
  return out;
}

TEST(HeldIslands, ForEachVisitsEveryIslandInOrderAndPutsIslandZeroBackAfterAThrow) {
  TrainConfig c = testing::tiny_config(1, 0);
  resolve_config(c);
  const Model model = build_model(c);
  MemoryLedger ledger;
  ShardedState state = states(model, c, ledger);
  const std::vector<const void*> island0 = params_of(state);
  HeldIslands islands(state, nullptr);
  for (int v = 1; v < 3; ++v) islands.add(std::move(states(model, c, ledger).units()), nullptr);
  ASSERT_EQ(islands.size(), 3);
  std::vector<std::vector<const void*>> seen;
  int switches = 0;
  islands.set_before_switch([&] { ++switches; });
  islands.for_each([&](int v) {
    EXPECT_EQ(islands.active(), v);
    seen.push_back(params_of(islands.state()));
  });
  EXPECT_EQ(islands.active(), 0);
  EXPECT_EQ(params_of(state), island0);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], island0);
  EXPECT_NE(seen[1], island0);
  EXPECT_NE(seen[2], seen[1]);
  EXPECT_EQ(switches, 3);  // to 1, to 2, back to 0
  // A throw on island 1 leaves island 0's states in place, with no caller switching back.
  EXPECT_THROW(islands.for_each([&](int v) {
    if (v == 1) throw std::runtime_error("island 1 failed");
  }),
               std::runtime_error);
  EXPECT_EQ(islands.active(), 0);
  EXPECT_EQ(params_of(state), island0);
  // The next iteration sees the islands as they were.
  std::vector<std::vector<const void*>> again;
  islands.for_each([&](int) { again.push_back(params_of(islands.state())); });
  EXPECT_EQ(again, seen);
}

// 8-bit codes stream from memory as from the offload file: one byte per element of the
// optimizer range, 0 at the elements of tensors whose moments stay fp32.
TEST(MemoryStore, HandsOutEightBitCodesAsTheOffloadFileDoes) {
  const TrainConfig c = int8_config();
  const Model model = build_model(c);
  MemoryLedger ledger;
  ShardedState in_memory = states(model, c, ledger);
  ShardedState offloaded = states(model, c, ledger, Offload::kOptimizer);
  testing::TempDir dir;
  OffloadTier tier(offloaded, Offload::kOptimizer, dir.path(), 0, 4096, ledger);
  tier.initialize(c.seed);
  MemoryStore memory(in_memory);
  std::vector<StateStore::Job> jobs;
  for (size_t i = 0; i < in_memory.units().size(); ++i) {
    jobs.push_back(
        {i, {0, in_memory.units()[i].opt_range.count()}, StateStore::kAdamM | StateStore::kAdamV});
  }
  // The same codes written through both stores on the quantized tensors' elements; through
  // memory's also on the others', where they are dropped.
  bool quantized_seen = false, fp32_seen = false;
  for (auto [store, state] : {std::pair<StateStore*, ShardedState*>{&memory, &in_memory},
                              std::pair<StateStore*, ShardedState*>{&tier, &offloaded}}) {
    store->stream(jobs, StateStore::Access::kReadWrite, [&](StateStore::Piece& p) {
      ASSERT_EQ(p.m8.size(), p.count);
      ASSERT_EQ(p.v8.size(), p.count);
      EXPECT_TRUE(p.m.empty() && p.v.empty());
      for (const DecaySegment& s : state->units()[p.unit].decay) {
        (s.quantized ? quantized_seen : fp32_seen) = true;
        if (!s.quantized && store != &memory) continue;
        for (size_t e = std::max(s.begin, p.begin); e < std::min(s.end, p.begin + p.count); ++e) {
          p.m8[e - p.begin] = static_cast<uint8_t>(1 + (e * 7 + p.unit) % 250);
          p.v8[e - p.begin] = static_cast<uint8_t>(1 + (e * 5 + p.unit) % 250);
        }
      }
    });
  }
  EXPECT_TRUE(quantized_seen && fp32_seen) << "the model needs tensors of both kinds";
  // Each moment's codes by element of each unit's optimizer range.
  const auto read = [&](StateStore& store) {
    std::vector<std::vector<uint8_t>> codes;
    for (const StateStore::Job& job : jobs) codes.emplace_back(2 * job.range.count(), uint8_t{1});
    store.stream(jobs, StateStore::Access::kRead, [&](StateStore::Piece& p) {
      std::vector<uint8_t>& unit = codes[p.unit];
      const size_t n = unit.size() / 2;
      std::copy(p.m8.begin(), p.m8.end(), unit.begin() + static_cast<std::ptrdiff_t>(p.begin));
      std::copy(p.v8.begin(), p.v8.end(), unit.begin() + static_cast<std::ptrdiff_t>(n + p.begin));
    });
    return codes;
  };
  const std::vector<std::vector<uint8_t>> from_memory = read(memory);
  EXPECT_EQ(from_memory, read(tier));
  // 0 at the fp32 tensors' elements.
  for (size_t i = 0; i < jobs.size(); ++i) {
    const size_t n = from_memory[i].size() / 2;
    for (const DecaySegment& s : in_memory.units()[i].decay) {
      for (size_t e = s.begin; e < s.end && !s.quantized; ++e) {
        EXPECT_EQ(from_memory[i][e], 0) << "unit " << i << " element " << e;
        EXPECT_EQ(from_memory[i][n + e], 0) << "unit " << i << " element " << e;
      }
    }
  }
  // What memory holds is the codes written, in its own compact buffers.
  const UnitState& u = in_memory.units().front();
  for (const DecaySegment& s : u.decay) {
    if (!s.quantized) continue;
    EXPECT_EQ(u.m_codes.span()[s.at], static_cast<uint8_t>(1 + (s.begin * 7) % 250));
  }
}

// The offload file is the state layout's: each unit's entries in the file, so its size is
// the one the planner sums (LayoutBytes::file, the forecast's and the ledger's disk bytes).
TEST(OffloadTier, HoldsTheFileTheStateLayoutSays) {
  struct Case {
    int stage;
    Precision precision;
    Offload offload;
    bool int8;
  };
  for (const Case k : {Case{1, Precision::kBF16, Offload::kOptimizer, false},
                       Case{0, Precision::kBF16, Offload::kOptimizer, true},
                       Case{2, Precision::kFP32, Offload::kOptimizer, false},
                       Case{3, Precision::kFP32, Offload::kOptimizer, true},
                       Case{3, Precision::kBF16, Offload::kParams, false},
                       Case{3, Precision::kFP16, Offload::kParams, true},
                       Case{3, Precision::kFP32, Offload::kParams, false},
                       Case{3, Precision::kFP32, Offload::kParams, true}}) {
    constexpr int kWorld = 3;
    TrainConfig c = testing::tiny_config(kWorld, k.stage, k.precision);
    c.offload = k.offload;
    c.int8_moments = k.int8;
    resolve_config(c);
    const Model model = build_model(c);
    const UnitTensors tensors = unit_tensors(model);
    std::vector<uint64_t> numel;
    for (const auto& u : model) numel.push_back(u->numel());
    for (int rank = 0; rank < kWorld; ++rank) {
      const std::string what =
          fmt::format("stage {} {} offload {}{} rank {}", k.stage, precision_name(k.precision),
                      offload_name(k.offload), k.int8 ? " int8" : "", rank);
      MemoryLedger ledger;
      ShardedState state(model, layout_plan(c), false, c.decay_all, c.seed, kWorld, rank, ledger);
      testing::TempDir dir;
      const OffloadTier tier(state, c.offload, dir.path(), rank, 4096, ledger);
      const uint64_t file = layout_bytes(layout_plan(c), numel, &tensors, kWorld, rank).file;
      EXPECT_GT(file, 0u) << what;
      EXPECT_EQ(tier.file().size(), file) << what;
    }
  }
}

// What the tier could not stream is refused, not mislaid: a state the layout puts in the file
// that no piece carries (Muon's momentum, which no option enables yet), and a tier told
// otherwise than the layout where the parameters are.
TEST(OffloadTier, RefusesAFileItsPiecesDoNotCarry) {
  TrainConfig c = testing::tiny_config(1, 3);
  c.offload = Offload::kOptimizer;
  resolve_config(c);
  const Model model = build_model(c);
  MemoryLedger ledger;
  testing::TempDir dir;
  LayoutPlan muon = layout_plan(c);
  muon.muon = true;
  ShardedState with_muon(model, muon, false, c.decay_all, c.seed, 1, 0, ledger);
  EXPECT_THROW(OffloadTier(with_muon, c.offload, dir.path(), 0, 4096, ledger), std::logic_error);
  ShardedState state(model, layout_plan(c), false, c.decay_all, c.seed, 1, 0, ledger);
  EXPECT_THROW(OffloadTier(state, Offload::kParams, dir.path(), 0, 4096, ledger), std::logic_error);
  EXPECT_NO_THROW(OffloadTier(state, Offload::kOptimizer, dir.path(), 0, 4096, ledger));
}

}  // namespace
}  // namespace zerodp
