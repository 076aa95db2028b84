// --trace writes a Chrome trace-event file: every rank, every unit's forward and backward,
// the optimizer, and one span per collective the comm ledger counted.
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "temp_dir.h"
#include "train_testing.h"

namespace zerodp {
namespace {

TEST(Trace, HoldsEveryRanksComputeAndEveryCollective) {
  testing::TempDir tmp;
  TrainConfig c = testing::tiny_config(3, 3);
  c.steps = 2;
  c.trace_path = (tmp.path() / "trace.json").string();
  const TrainResult r = testing::run(c);
  std::ifstream in(c.trace_path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  ASSERT_TRUE(trace.contains("traceEvents"));
  std::map<int, int> comm_spans, forward, backward, optimizer, steps;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["dur"].get<int64_t>(), 0);
    const int pid = e["pid"].get<int>();
    const std::string name = e["name"].get<std::string>();
    if (e["tid"] == 1) ++comm_spans[pid];
    if (name.starts_with("forward ")) ++forward[pid];
    if (name.starts_with("backward ")) ++backward[pid];
    if (name == "optimizer") ++optimizer[pid];
    if (name.starts_with("step ")) ++steps[pid];
  }
  const int units = static_cast<int>(r.unit_names.size());
  for (int rank = 0; rank < 3; ++rank) {
    uint64_t calls = 0;
    for (const auto& k : r.ranks[static_cast<size_t>(rank)].comm_train) calls += k.calls;
    for (const auto& k : r.ranks[static_cast<size_t>(rank)].comm_other) calls += k.calls;
    // The summary's own gather comes after the snapshot the ledger figures are taken from.
    EXPECT_EQ(static_cast<uint64_t>(comm_spans[rank]), calls + 1) << "rank " << rank;
    EXPECT_EQ(backward[rank], 2 * units) << "rank " << rank;
    EXPECT_GE(forward[rank], 2 * units) << "rank " << rank;  // + the evaluation's
    EXPECT_EQ(optimizer[rank], 2) << "rank " << rank;
    EXPECT_EQ(steps[rank], 2) << "rank " << rank;
  }
}

}  // namespace
}  // namespace zerodp

namespace zerodp {
namespace {

TEST(Mfu, IsModelFlopsOverTheCalibratedPeak) {
  TrainConfig c = testing::tiny_config(2, 1);
  c.steps = 3;
  const TrainResult r = testing::run(c);
  // tiny: 6 per parameter plus attention's 12 x layers x T x C.
  EXPECT_DOUBLE_EQ(r.flops_per_token, 6.0 * static_cast<double>(r.params) + 12.0 * 2 * 32 * 32);
  EXPECT_GT(r.peak_flops, 1e9) << "a GEMM slower than 1 GFLOP/s: the calibration is broken";
  EXPECT_DOUBLE_EQ(r.mfu, r.flops_per_token * r.tokens_per_second / r.peak_flops);
  EXPECT_GT(r.mfu, 0.0);
  EXPECT_LT(r.mfu, 1.5) << "model FLOPs well past the measured peak";
  for (const auto& s : r.steps) {
    ASSERT_TRUE(s.mfu.has_value());
    EXPECT_GT(*s.mfu, 0.0);
  }
}

}  // namespace
}  // namespace zerodp
