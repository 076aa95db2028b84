// The run report read back (train/report_reader.h): what report_json writes, read_report
// returns field for field, for a result built here (every optional both ways, a
// continuation's history, non-finite losses, an early stop and a restart) and for a real
// run; a missing or wrongly typed key is refused with one line naming the file and the key's
// path; a --metrics log reads the same step records.
#include <cmath>
#include <csignal>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/version.h"
#include "train/plan.h"
#include "train/report.h"
#include "train/report_reader.h"
#include "train/stop.h"
#include "train_testing.h"

namespace zerodp {
namespace {

using nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

StepRecord step(int64_t n, double loss) {
  StepRecord s;
  s.step = n;
  s.loss = loss;
  s.lr = 1e-3;
  s.grad_norm = 1.5;
  s.grad_norm_clipped = 1.0;
  s.tokens = 512;
  s.seconds = 0.25;
  s.mfu = 0.1;
  return s;
}

// A continuation on 2 ranks at stage 3 in fp16, one rank per node, with a value in every key
// the page reads.
TrainResult made_result() {
  TrainResult r;
  r.is_reporter = true;
  r.config = testing::tiny_config(2, 3, Precision::kFP16);
  r.config.launch.comm.node_ranks = 1;
  r.config.steps = 5;
  r.config.offload = Offload::kParams;  // the ranks' nvme_bytes are written
  r.unit_names = {"wte", "block.0", "lm_head"};
  r.unit_numel = {1000, 333, 77};
  r.params = 1410;
  r.world_size = 2;
  r.backend = "local";
  r.data_description = "synthetic: 4096 train tokens, 512 validation";
  r.resumed_from = "ckpt/step-000002";
  r.first_step = 3;
  r.history = {step(1, 5.5), step(2, 5.25)};
  r.history[1].val_loss = 5.3;
  r.steps = {step(3, 5.0), step(4, kNaN), step(5, 4.75)};
  r.steps[0].val_loss = kNaN;  // evaluated, not finite: null in the file
  r.steps[2].val_loss = 4.8;
  r.steps[2].checkpoint = "ckpt/step-000005";
  r.final_loss = 4.75;
  r.val_loss = 4.9;
  r.weights_sha256 = std::string(64, 'a');
  r.stopped = EarlyStop{EarlyStop::Reason::kSignal, SIGTERM, 5, "step 5: interrupted by SIGTERM"};
  // The launch described came after a rank of three failed at step 4.
  r.restarts = {Restart{4, 2, "injected failure (--inject throw@4:2)", 3, 2, 2, 3, 2,
                        "ckpt/step-000002", ""}};
  r.tokens_per_second = 2048.5;
  r.mfu = 0.125;
  for (int rank = 0; rank < 2; ++rank) {
    RankSummary s;
    s.rank = rank;
    for (int k = 0; k < kNumMemCategories; ++k) {
      if (k <= static_cast<int>(MemCategory::kAdamV)) s.model_state[k] = 100 * (rank + 1) + k;
      s.peak[k] = 1000 * (rank + 1) + k;
    }
    s.peak_total = 50000 + rank;
    s.nvme_bytes = 7000000 + 4096u * rank;
    for (int k = 0; k < kNumCommKinds; ++k) {
      // Part of each kind's bytes crossed nodes, a different part per kind and rank.
      s.comm_train[k] = {static_cast<uint64_t>(k + 1), 4096u * (k + 1) + rank,
                         1000u * k + 10u * rank};
      s.comm_other[k] = {1, 7};
    }
    s.samples_sha256 = std::string(64, 'b');
    r.ranks.push_back(s);
  }
  return r;
}

// Through text, as a file holds it: a non-finite double becomes null only when dumped.
RunReport round_trip(const TrainResult& r) { return parse_report(report_json(r).dump(), "r.json"); }

void expect_same_step(const StepRecord& want, const ReportStep& got, bool evaluated) {
  SCOPED_TRACE(fmt::format("step {}", want.step));
  EXPECT_EQ(got.step, static_cast<double>(want.step));
  if (std::isfinite(want.loss)) {
    ASSERT_TRUE(got.loss.has_value());
    EXPECT_EQ(*got.loss, want.loss);
  } else {
    EXPECT_FALSE(got.loss.has_value());
  }
  EXPECT_EQ(got.evaluated, evaluated);
  if (want.val_loss && std::isfinite(*want.val_loss)) {
    ASSERT_TRUE(got.val_loss.has_value());
    EXPECT_EQ(*got.val_loss, *want.val_loss);
  } else {
    EXPECT_FALSE(got.val_loss.has_value());
  }
}

void expect_same(const TrainResult& want, const RunReport& got) {
  EXPECT_EQ(got.zerodp_version, zerodp_version());
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.world_size, want.world_size);
  EXPECT_EQ(got.stage, want.config.stage);
  EXPECT_EQ(got.precision, want.config.precision);
  EXPECT_EQ(got.backend, want.backend);
  EXPECT_EQ(got.data, want.data_description);
  EXPECT_EQ(got.resumed_from.value_or(""), want.resumed_from);
  ASSERT_TRUE(got.model.has_value());
  EXPECT_EQ(got.model->model, want.config.model);
  EXPECT_EQ(got.model->size.value_or(""), want.config.size);
  EXPECT_EQ(got.final_loss, std::optional<double>(want.final_loss));
  EXPECT_EQ(got.final_val_loss, want.val_loss);
  EXPECT_EQ(got.weights_sha256, want.weights_sha256);
  if (want.config.launch.comm.node_ranks > 0) {
    EXPECT_EQ(got.node_ranks, std::optional<uint64_t>(want.config.launch.comm.node_ranks));
  } else {
    EXPECT_FALSE(got.node_ranks.has_value());
  }
  EXPECT_EQ(got.tokens_per_second, std::optional<double>(want.tokens_per_second));
  EXPECT_EQ(got.mfu, std::optional<double>(want.mfu));
  EXPECT_EQ(got.planned_steps, std::optional<uint64_t>(want.config.steps));
  EXPECT_EQ(got.stop_after, std::optional<uint64_t>(want.config.stop_after));
  ASSERT_EQ(got.stopped.has_value(), want.stopped.has_value());
  if (want.stopped) {
    EXPECT_EQ(got.stopped->reason, want.stopped->reason == EarlyStop::Reason::kSignal ? "signal"
                                   : want.stopped->reason == EarlyStop::Reason::kMaxSkips
                                       ? "max_skips"
                                       : "checkpoint_failed");
    const bool signal = want.stopped->reason == EarlyStop::Reason::kSignal;
    EXPECT_EQ(
        got.stopped->signal,
        signal ? std::optional<std::string>(signal_name(want.stopped->signal)) : std::nullopt);
    EXPECT_EQ(got.stopped->after_step, static_cast<uint64_t>(want.stopped->after_step));
    EXPECT_EQ(got.stopped->message, want.stopped->message);
  }
  ASSERT_EQ(got.restarts.size(), want.restarts.size());
  for (size_t i = 0; i < want.restarts.size(); ++i) {
    SCOPED_TRACE(fmt::format("restart {}", i));
    const Restart& w = want.restarts[i];
    const ReportRestart& g = got.restarts[i];
    EXPECT_EQ(g.failed_step, static_cast<uint64_t>(w.failed_step));
    EXPECT_EQ(g.failed_rank, w.failed_rank >= 0
                                 ? std::optional<uint64_t>(static_cast<uint64_t>(w.failed_rank))
                                 : std::nullopt);
    EXPECT_EQ(g.cause, w.cause);
    EXPECT_EQ(g.ranks_before, static_cast<uint64_t>(w.ranks_before));
    EXPECT_EQ(g.ranks_after, static_cast<uint64_t>(w.ranks_after));
    EXPECT_EQ(g.resumed_step, static_cast<uint64_t>(w.resumed_step));
  }
  ASSERT_EQ(got.history.size(), want.history.size());
  for (size_t i = 0; i < want.history.size(); ++i) {
    expect_same_step(want.history[i], got.history[i], want.history[i].val_loss.has_value());
  }
  ASSERT_EQ(got.steps.size(), want.steps.size());
  for (size_t i = 0; i < want.steps.size(); ++i) {
    expect_same_step(want.steps[i], got.steps[i], want.steps[i].val_loss.has_value());
  }
  ASSERT_EQ(got.ranks.size(), want.ranks.size());
  for (size_t i = 0; i < want.ranks.size(); ++i) {
    SCOPED_TRACE(fmt::format("rank {}", i));
    const RankSummary& w = want.ranks[i];
    const ReportRank& g = got.ranks[i];
    EXPECT_EQ(g.rank, static_cast<uint64_t>(w.rank));
    for (int k = 0; k < kNumMemCategories; ++k) {
      const bool state = k <= static_cast<int>(MemCategory::kAdamV);
      EXPECT_EQ(g.model_state[k], state ? w.model_state[k] : 0) << k;
      EXPECT_EQ(g.peak[k], state ? 0 : w.peak[k]) << k;
    }
    EXPECT_EQ(g.peak_total, w.peak_total);
    EXPECT_EQ(g.nvme_bytes, w.nvme_bytes);
    ASSERT_EQ(g.comm_bytes.size(), static_cast<size_t>(kNumCommKinds));
    for (int k = 0; k < kNumCommKinds; ++k) {
      const std::string kind(comm_kind_name(static_cast<CommKind>(k)));
      ASSERT_TRUE(g.comm_bytes.contains(kind)) << kind;
      EXPECT_EQ(g.comm_bytes.at(kind), w.comm_train[k].bytes) << kind;
      ASSERT_TRUE(g.comm_cross_node_bytes.contains(kind)) << kind;
      EXPECT_EQ(g.comm_cross_node_bytes.at(kind), w.comm_train[k].cross_node_bytes) << kind;
    }
  }
  ASSERT_TRUE(got.plan.has_value());
  ASSERT_EQ(got.plan->size(), want.ranks.size());
  const TrainConfig& c = want.config;
  for (int rank = 0; rank < want.world_size; ++rank) {
    SCOPED_TRACE(fmt::format("plan rank {}", rank));
    const StateBytes s = model_state_bytes(want.unit_numel, want.world_size, c.stage, c.precision,
                                           rank, fp32_accumulator(c), c.offload);
    const ReportPlanRank& p = (*got.plan)[rank];
    EXPECT_EQ(p.model_state.params, s.params);
    EXPECT_EQ(p.model_state.grads, s.grads);
    EXPECT_EQ(p.model_state.master, s.master);
    EXPECT_EQ(p.model_state.adam_m, s.adam_m);
    EXPECT_EQ(p.model_state.adam_v, s.adam_v);
    EXPECT_EQ(p.model_state_total, s.total());
    const CommBytes cb =
        comm_bytes_per_step(want.unit_numel, want.world_size, c.stage, c.precision, c.grad_accum,
                            c.accumulate, canonical_order(c), rank, comm_modes_of(c));
    EXPECT_EQ(p.comm_bytes_per_step, cb.total());
    EXPECT_EQ(p.comm_cross_node_bytes_per_step, std::optional<uint64_t>(cb.cross_total()));
  }
}

TEST(ReportReader, ReadsBackWhatTheWriterWrote) {
  const TrainResult r = made_result();
  expect_same(r, round_trip(r));
}

TEST(ReportReader, ReadsBackAFreshRunWithNullsWhereTheWriterWritesThem) {
  TrainResult r = made_result();
  r.config.launch.comm.node_ranks = 0;  // one node: config.node_ranks is null
  r.resumed_from.clear();
  r.history.clear();
  r.val_loss.reset();
  r.config.precision = Precision::kBF16;
  r.final_loss = kNaN;
  r.stopped.reset();  // it reached its last step: `stopped` is null
  r.restarts.clear();
  r.restarts.push_back({});  // and a restart whose failed rank was not known
  r.restarts.back().cause = "rank thread gone";
  const RunReport got = round_trip(r);
  EXPECT_FALSE(got.stopped.has_value());
  EXPECT_FALSE(got.restarts.at(0).failed_rank.has_value());
  EXPECT_FALSE(got.resumed_from.has_value());
  EXPECT_TRUE(got.history.empty());
  EXPECT_FALSE(got.final_val_loss.has_value());
  EXPECT_FALSE(got.final_loss.has_value());
  EXPECT_EQ(got.precision, Precision::kBF16);
  EXPECT_FALSE(got.node_ranks.has_value());
}

TEST(ReportReader, ReadsBackARealRun) {
  TrainConfig c = testing::tiny_config(2, 3);
  c.eval_every = 2;
  const TrainResult r = testing::run(c);
  ASSERT_TRUE(r.is_reporter);
  ASSERT_EQ(r.steps.size(), 3u);
  const RunReport got = round_trip(r);
  expect_same(r, got);
  // Stage 3 communicates every step: the page's comm bars are not all zero.
  EXPECT_GT(got.ranks[0].comm_bytes.at("all_gather"), 0u);
}

// Over nodes of 2 ranks, 4 ranks receive part of their bytes from the other node: what the
// reader returns is the ledger's split, and it agrees with the plan's (which leaves out the
// control scalars).
TEST(ReportReader, ReadsBackTheBytesCrossingNodesOfARealRun) {
  TrainConfig c = testing::tiny_config(4, 3);
  c.launch.comm.node_ranks = 2;
  const TrainResult r = testing::run(c);
  ASSERT_TRUE(r.is_reporter);
  const RunReport got = round_trip(r);
  expect_same(r, got);
  ASSERT_EQ(got.node_ranks, std::optional<uint64_t>(2));
  ASSERT_TRUE(got.plan.has_value());
  for (const ReportRank& rank : got.ranks) {
    SCOPED_TRACE(fmt::format("rank {}", rank.rank));
    const uint64_t gather = rank.comm_bytes.at("all_gather");
    const uint64_t gather_cross = rank.comm_cross_node_bytes.at("all_gather");
    EXPECT_GT(gather_cross, 0u);
    EXPECT_LT(gather_cross, gather);  // the peer on its own node sent the rest
    uint64_t planned_kinds = 0;
    for (const char* kind : {"all_reduce", "reduce_scatter", "all_gather"}) {
      planned_kinds += rank.comm_cross_node_bytes.at(kind);
    }
    EXPECT_EQ(std::optional<uint64_t>(planned_kinds / r.steps.size()),
              (*got.plan)[rank.rank].comm_cross_node_bytes_per_step);
  }
}

// Reports of earlier versions: no history, no plan, no config, yet the page can be drawn.
TEST(ReportReader, ReadsAReportWithoutTheKeysItDoesNotNeed) {
  json j = report_json(made_result());
  j.erase(report_key::kHistory);
  j.erase(report_key::kPlan);
  j.erase(report_key::kConfig);
  j.erase(report_key::kData);
  j[report_key::kResumedFrom] = 7;
  const RunReport got = report_from_json(j, "old.json");
  EXPECT_TRUE(got.history.empty());
  EXPECT_FALSE(got.plan.has_value());
  EXPECT_FALSE(got.model.has_value());
  EXPECT_EQ(got.data, "");
  EXPECT_FALSE(got.resumed_from.has_value());
  EXPECT_EQ(got.steps.size(), 3u);
  EXPECT_FALSE(got.node_ranks.has_value());
  EXPECT_FALSE(got.planned_steps.has_value());
  EXPECT_FALSE(got.stop_after.has_value());

  // Before early stops and restarts were recorded; keys the page only shows, wrongly typed.
  json older = report_json(made_result());
  older.erase(report_key::kStopped);
  older.erase(report_key::kRestarts);
  older[report_key::kConfig]["steps"] = "5";
  older[report_key::kConfig]["stop_after"] = -1;
  const RunReport before = report_from_json(older, "older.json");
  EXPECT_FALSE(before.stopped.has_value());
  EXPECT_TRUE(before.restarts.empty());
  EXPECT_FALSE(before.planned_steps.has_value());
  EXPECT_FALSE(before.stop_after.has_value());
}

// A --stop-after slice ends short of --steps with no `stopped`: the page tells it from a
// completed run by config.steps and config.stop_after.
TEST(ReportReader, ReadsTheStepsPlannedAndTheSlice) {
  TrainResult r = made_result();
  r.stopped.reset();
  r.config.steps = 9;
  r.config.stop_after = 5;
  const RunReport got = round_trip(r);
  EXPECT_FALSE(got.stopped.has_value());
  EXPECT_EQ(got.planned_steps, std::optional<uint64_t>(9));
  EXPECT_EQ(got.stop_after, std::optional<uint64_t>(5));
}

// Reports written before the ledger counted the bytes crossing nodes (no cross_node_bytes,
// no config.node_ranks), and those from before the plan counted them (the ranks have them,
// the plan not): what is missing reads as absent, not as 0 and not as an error.
TEST(ReportReader, ReadsAReportFromBeforeTheBytesCrossingNodes) {
  const json now = report_json(made_result());
  json before_plan = now;
  for (json& p : before_plan[report_key::kPlan][report_key::kCommBytesPerStep]) {
    p.erase(report_key::kCrossNodeBytes);
  }
  const RunReport mid = parse_report(before_plan.dump(), "mid.json");
  EXPECT_EQ(mid.node_ranks, std::optional<uint64_t>(1));
  EXPECT_EQ(mid.ranks[1].comm_cross_node_bytes.size(), static_cast<size_t>(kNumCommKinds));
  ASSERT_TRUE(mid.plan.has_value());
  for (const ReportPlanRank& p : *mid.plan) {
    EXPECT_FALSE(p.comm_cross_node_bytes_per_step.has_value());
    EXPECT_GT(p.comm_bytes_per_step, 0u);
  }

  json old = before_plan;
  old[report_key::kConfig].erase("node_ranks");
  for (json& rank : old[report_key::kRanks]) {
    for (auto& [kind, v] : rank[report_key::kComm].items()) v.erase(report_key::kCrossNodeBytes);
    rank[report_key::kPeakBytes].erase("offload_staging");  // before offload existed
  }
  const RunReport got = parse_report(old.dump(), "old.json");
  EXPECT_FALSE(got.node_ranks.has_value());
  for (const ReportRank& rank : got.ranks) {
    EXPECT_TRUE(rank.comm_cross_node_bytes.empty());
    EXPECT_EQ(rank.comm_bytes.size(), static_cast<size_t>(kNumCommKinds));
  }
  EXPECT_EQ(got.ranks[1].comm_bytes.at("all_gather"), mid.ranks[1].comm_bytes.at("all_gather"));
}

struct Refusal {
  std::string name;
  std::function<void(json&)> change;
  std::string message;  // after "report 'r.json' is not a zerodp train report: "
};

TEST(ReportReader, RefusesAMissingOrWronglyTypedKeyNamingIt) {
  const json good = report_json(made_result());
  const std::vector<Refusal> cases = {
      {"no version", [](json& j) { j.erase("zerodp_version"); }, "'zerodp_version' is missing"},
      {"no params", [](json& j) { j.erase("params"); }, "'params' is missing"},
      {"world_size a string", [](json& j) { j["world_size"] = "2"; },
       "'world_size' is not a non-negative integer"},
      {"world_size 0", [](json& j) { j["world_size"] = 0; }, "'world_size' is 0"},
      {"stage 4", [](json& j) { j["stage"] = 4; }, "'stage' is 4; stages are 0..3"},
      {"stage negative", [](json& j) { j["stage"] = -1; }, "'stage' is not a non-negative integer"},
      {"precision fp8", [](json& j) { j["precision"] = "fp8"; },
       "'precision' is 'fp8'; expected bf16, fp16 or fp32"},
      {"backend a number", [](json& j) { j["backend"] = 1; }, "'backend' is not a string"},
      {"final an array", [](json& j) { j["final"] = json::array(); }, "'final' is not an object"},
      {"final.loss a string", [](json& j) { j["final"]["loss"] = "low"; },
       "'final.loss' is not a number"},
      {"no weights hash", [](json& j) { j["final"].erase("weights_sha256"); },
       "'final.weights_sha256' is missing"},
      {"no throughput", [](json& j) { j.erase("throughput"); }, "'throughput' is missing"},
      {"mfu a string", [](json& j) { j["throughput"]["mfu"] = "x"; },
       "'throughput.mfu' is not a number"},
      {"steps an object", [](json& j) { j["steps"] = json::object(); }, "'steps' is not an array"},
      {"a step not an object", [](json& j) { j["steps"][2] = 3; }, "'steps[2]' is not an object"},
      {"a step without its number", [](json& j) { j["steps"][1].erase("step"); },
       "'steps[1].step' is missing or not a number"},
      {"a loss a string", [](json& j) { j["steps"][0]["loss"] = "5"; },
       "'steps[0].loss' is missing or not a number"},
      {"a val_loss a string", [](json& j) { j["steps"][2]["val_loss"] = "5"; },
       "'steps[2].val_loss' is not a number"},
      {"a history step without loss", [](json& j) { j["history"][1].erase("loss"); },
       "'history[1].loss' is missing or not a number"},
      {"history an object", [](json& j) { j["history"] = json::object(); },
       "'history' is not an array"},
      {"one rank short", [](json& j) { j["ranks"].erase(1); },
       "'ranks' has 1 entries for world_size 2"},
      {"a rank not an object", [](json& j) { j["ranks"][1] = "r"; }, "'ranks[1]' is not an object"},
      {"a rank without states", [](json& j) { j["ranks"][0].erase("model_state_bytes"); },
       "'ranks[0].model_state_bytes' is missing"},
      {"a state a float", [](json& j) { j["ranks"][1]["model_state_bytes"]["adam_v"] = 1.5; },
       "'ranks[1].model_state_bytes.adam_v' is not a non-negative integer"},
      {"a peak missing", [](json& j) { j["ranks"][0]["peak_bytes"].erase("workspace"); },
       "'ranks[0].peak_bytes.workspace' is missing"},
      {"peak total missing", [](json& j) { j["ranks"][1]["peak_bytes"].erase("total"); },
       "'ranks[1].peak_bytes.total' is missing"},
      {"comm an array", [](json& j) { j["ranks"][0]["comm"] = json::array(); },
       "'ranks[0].comm' is not an object"},
      {"comm bytes negative", [](json& j) { j["ranks"][1]["comm"]["all_gather"]["bytes"] = -1; },
       "'ranks[1].comm.all_gather.bytes' is not a non-negative integer"},
      {"plan an array", [](json& j) { j["plan"] = json::array(); }, "'plan' is not an object"},
      {"plan one rank short", [](json& j) { j["plan"]["comm_bytes_per_step"].erase(0); },
       "'plan' does not have one entry per rank (world_size 2)"},
      {"plan states total missing",
       [](json& j) { j["plan"]["model_state_bytes"][1].erase("total"); },
       "'plan.model_state_bytes[1].total' is missing"},
      {"cross-node bytes a string",
       [](json& j) { j["ranks"][0]["comm"]["all_gather"]["cross_node_bytes"] = "0"; },
       "'ranks[0].comm.all_gather.cross_node_bytes' is not a non-negative integer"},
      {"more bytes crossing nodes than received",
       [](json& j) {
         j["ranks"][1]["comm"]["reduce_scatter"]["bytes"] = 10;
         j["ranks"][1]["comm"]["reduce_scatter"]["cross_node_bytes"] = 11;
       },
       "'ranks[1].comm.reduce_scatter.cross_node_bytes' is 11, more than the 10 bytes it is "
       "part of"},
      {"node_ranks 0", [](json& j) { j["config"]["node_ranks"] = 0; },
       "'config.node_ranks' is 0; expected a positive integer (ranks per node) or null"},
      {"node_ranks a string", [](json& j) { j["config"]["node_ranks"] = "2"; },
       "'config.node_ranks' is \"2\"; expected a positive integer (ranks per node) or null"},
      {"plan cross-node bytes negative",
       [](json& j) { j["plan"]["comm_bytes_per_step"][1]["cross_node_bytes"] = -5; },
       "'plan.comm_bytes_per_step[1].cross_node_bytes' is not a non-negative integer"},
      {"stopped an array", [](json& j) { j["stopped"] = json::array(); },
       "'stopped' is not an object or null"},
      {"stopped without its reason", [](json& j) { j["stopped"].erase("reason"); },
       "'stopped.reason' is missing"},
      {"stopped after a step that is not one", [](json& j) { j["stopped"]["after_step"] = "5"; },
       "'stopped.after_step' is not a non-negative integer"},
      {"stopped by a signal that is a number", [](json& j) { j["stopped"]["signal"] = 15; },
       "'stopped.signal' is not a string"},
      {"stopped without its message", [](json& j) { j["stopped"].erase("message"); },
       "'stopped.message' is missing"},
      {"restarts an object", [](json& j) { j["restarts"] = json::object(); },
       "'restarts' is not an array"},
      {"a restart without its step", [](json& j) { j["restarts"][0].erase("failed_step"); },
       "'restarts[0].failed_step' is missing"},
      {"a restart's ranks negative", [](json& j) { j["restarts"][0]["ranks_after"] = -1; },
       "'restarts[0].ranks_after' is not a non-negative integer"},
      {"plan comm total a string",
       [](json& j) { j["plan"]["comm_bytes_per_step"][0]["total"] = "1"; },
       "'plan.comm_bytes_per_step[0].total' is not a non-negative integer"},
  };
  for (const Refusal& c : cases) {
    SCOPED_TRACE(c.name);
    json j = good;
    c.change(j);
    try {
      // Through text, as zerodp report reads it.
      parse_report(j.dump(), "r.json");
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()),
                "report 'r.json' is not a zerodp train report: " + c.message);
    }
  }
}

TEST(ReportReader, RefusesWhatIsNotAReportSayingWhatItIs) {
  const auto message = [](const std::string& text) -> std::string {
    try {
      parse_report(text, "r.json");
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(message("[1, 2]"),
            "report 'r.json' is not a zerodp train report: it holds a JSON array, not an object");
  EXPECT_EQ(message(R"({"step": 1, "loss": 2.5})"),
            "report 'r.json' is not a zerodp train report: it holds one step record; pass a "
            "--metrics log with --metrics");
  EXPECT_EQ(message("{\"step\": 1, \"loss\": 2.5}\n{\"step\": 2, \"loss\": 2.4}\n"),
            "report 'r.json' is a --metrics log (one JSON line per step), not a report; pass it "
            "with --metrics");
  try {
    parse_report(report_json(made_result()).dump().substr(0, 300), "r.json");
    ADD_FAILURE() << "a truncated report was accepted";
  } catch (const CorruptData& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with("report 'r.json' is not valid JSON: "))
        << e.what();
  }
  EXPECT_THROW(read_report("/nonexistent/r.json"), IoError);
}

std::string metrics_log(const std::vector<StepRecord>& steps) {
  std::string text;
  for (const StepRecord& s : steps) text += step_json(s).dump() + "\n";
  return text;
}

TEST(MetricsReader, ReadsTheStepRecordsAndLeavesOutALineInProgress) {
  const TrainResult r = made_result();
  const auto got = parse_metrics(metrics_log(r.steps) + R"({"step":6,"lo)", "m.jsonl");
  ASSERT_EQ(got.size(), r.steps.size());
  for (size_t i = 0; i < got.size(); ++i) {
    expect_same_step(r.steps[i], got[i], r.steps[i].val_loss.has_value());
  }
}

TEST(MetricsReader, RefusesABadLineNamingItsNumberAndKey) {
  const TrainResult r = made_result();
  const std::string good = metrics_log(r.steps);
  const auto message = [](const std::string& text) -> std::string {
    try {
      parse_metrics(text, "m.jsonl");
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(message(good + "{\"step\": 4}\n"),
            "metrics 'm.jsonl' line 4 is not a zerodp step record (no 'step' and 'loss')");
  EXPECT_EQ(message(good + "{\"step\": \"4\", \"loss\": 1}\n"),
            "metrics 'm.jsonl' line 4: 'step' is missing or not a number");
  EXPECT_EQ(message("{\"step\": 1, \"loss\": []}\n"),
            "metrics 'm.jsonl' line 1: 'loss' is missing or not a number");
  EXPECT_EQ(message("\n{\"step\": 1, \"loss\": 2, \"val_loss\": \"x\"}\n"),
            "metrics 'm.jsonl' line 2: 'val_loss' is not a number");
  EXPECT_TRUE(message(good + "{\"step\": 4,\n")
                  .starts_with("metrics 'm.jsonl' line 4 is not valid JSON: "));
  EXPECT_EQ(message(report_json(r).dump()),
            "metrics 'm.jsonl' is a run report, not a --metrics log; pass it without --metrics");
}

}  // namespace
}  // namespace zerodp
