// The forecast estimate prints is the planner a run allocates by: a row is the TrainConfig
// train would run, and a mode over nodes costs what a run with that mode's switches holds.
#include <algorithm>

#include <gtest/gtest.h>

#include "models/gpt.h"
#include "train/forecast.h"

namespace zerodp {
namespace {

TrainConfig asked_gpt(const GptConfig& g) {
  TrainConfig c;
  c.layers = g.layers;
  c.heads = g.heads;
  c.embd = g.embd;
  c.seq_len = g.seq_len;
  c.micro_batch = 4;
  c.grad_accum = 2;
  c.accumulate_default = true;
  return c;
}

TEST(RowConfig, KeepsOnlyWhatTheStageActsOn) {
  TrainConfig asked;
  asked.launch.comm.node_ranks = 2;
  asked.hpz = true;
  asked.qwz = true;
  asked.shard_within_node = true;
  asked.grad_accum = 4;
  asked.accumulate_default = true;
  const TrainConfig s0 = row_config(asked, 4, 0, Offload::kParams);
  EXPECT_FALSE(s0.hpz);
  EXPECT_FALSE(s0.qwz);
  EXPECT_FALSE(s0.shard_within_node);
  EXPECT_EQ(s0.offload, Offload::kOptimizer);  // parameters go to disk at stage 3 only
  EXPECT_EQ(s0.accumulate, AccumulatePolicy::kLocal);
  EXPECT_FALSE(s0.accumulate_default);
  EXPECT_EQ(s0.launch.ranks, 4);
  const TrainConfig s1 = row_config(asked, 4, 1, Offload::kNone);
  EXPECT_TRUE(s1.shard_within_node);
  EXPECT_FALSE(s1.hpz);
  const TrainConfig s3 = row_config(asked, 8, 3, Offload::kNone);
  EXPECT_TRUE(s3.hpz);
  EXPECT_TRUE(s3.qwz);
  EXPECT_EQ(s3.accumulate, AccumulatePolicy::kReduce);
  // qwZ quantizes from the master, which offload keeps on disk.
  EXPECT_FALSE(row_config(asked, 8, 3, Offload::kOptimizer).qwz);
  // A policy the user gave is kept.
  asked.accumulate_default = false;
  asked.accumulate = AccumulatePolicy::kLocal;
  EXPECT_EQ(row_config(asked, 8, 3, Offload::kNone).accumulate, AccumulatePolicy::kLocal);
}

// Each mode's need is counted from the units' sizes (estimate --params has no layers); for a
// model with layers it must equal the forecast of the run with the mode's switches, whose
// buffers come from the engine's own layout.
TEST(NodeModes, NeedEqualsTheRunWithTheModesSwitches) {
  const GptConfig g{.layers = 2, .heads = 2, .embd = 32, .seq_len = 16};
  const Model model = make_gpt(g);
  PlannedModel m{.model = &model, .layers = g.layers, .seq_len = g.seq_len, .embd = g.embd};
  for (const auto& u : model) m.units.push_back(u->numel());
  for (const Precision p : {Precision::kBF16, Precision::kFP32}) {
    TrainConfig asked = asked_gpt(g);
    asked.precision = p;
    asked.launch.comm.node_ranks = 2;
    asked.qwz_block = 64;
    asked.prefetch = 2;
    const TrainConfig stage3 = row_config(asked, 6, 3, Offload::kNone);
    const std::vector<ModeForecast> modes = node_mode_forecasts(stage3, m, {});
    ASSERT_EQ(modes.size(), 12u);
    for (const ModeForecast& mode : modes) {
      TrainConfig run = stage3;
      run.launch.comm.two_level = mode.mode.modes.two_level;
      run.launch.comm.qgz_bits = mode.mode.modes.qgz_bits;
      run.hpz = mode.mode.modes.hpz;
      run.qwz = mode.mode.modes.qwz_block > 0;
      run.shard_within_node = mode.mode.modes.shard_within_node;
      const Forecast fc = forecast(run, m);
      EXPECT_EQ(mode.need, fc.need) << mode.mode.name << " " << precision_name(p);
      EXPECT_EQ(mode.comm.total(), fc.comm.total()) << mode.mode.name;
      EXPECT_EQ(mode.comm.cross_total(), fc.comm.cross_total()) << mode.mode.name;
    }
  }
}

TEST(NodeModes, PickTheFewestCrossNodeBytesThatFit) {
  TrainConfig asked;
  asked.launch.comm.node_ranks = 4;
  asked.accumulate_default = true;
  const PlannedModel m{.units = {1 << 20, 3 << 18, 12345}};
  const TrainConfig stage3 = row_config(asked, 16, 3, Offload::kNone);
  const std::vector<ModeForecast> modes = node_mode_forecasts(stage3, m, {});
  const ModeChoice free = choose_mode(modes, std::nullopt);
  ASSERT_TRUE(free.fits);
  for (const ModeForecast& r : modes) {
    EXPECT_LE(modes[free.pick].comm.cross_total(), r.comm.cross_total()) << r.mode.name;
  }
  // A budget below the pick's need moves the choice to one that fits, or says none does.
  const uint64_t tight = modes[free.pick].need - 1;
  const ModeChoice c = choose_mode(modes, tight);
  if (c.fits) {
    EXPECT_LE(modes[c.pick].need, tight);
    EXPECT_NE(c.pick, free.pick);
  }
  EXPECT_EQ(c.fastest, free.pick);
  // --invariant on keeps flat collectives: the reordering modes are priced but not chosen.
  asked.invariant = true;
  const std::vector<ModeForecast> kept =
      node_mode_forecasts(row_config(asked, 16, 3, Offload::kNone), m, {});
  EXPECT_EQ(kept[choose_mode(kept, std::nullopt).pick].mode.name, "flat");
}

// The step's time: compute from the FLOPs, comm issued during backward hidden behind it, and
// the offload file's I/O on top.
TEST(Forecast, PricesTheStep) {
  const GptConfig g{.layers = 2, .heads = 2, .embd = 32, .seq_len = 16};
  const Model model = make_gpt(g);
  PlannedModel m{.model = &model, .layers = g.layers, .seq_len = g.seq_len, .embd = g.embd};
  for (const auto& u : model) m.units.push_back(u->numel());
  const TrainConfig c = row_config(asked_gpt(g), 4, 3, Offload::kOptimizer);
  const StepInputs in{.flops = 1e9, .bandwidth = 1e8, .disk = DiskBandwidth{1e8, 5e7}};
  const Forecast fc = forecast(c, m, in);
  ASSERT_TRUE(fc.time.has_value());
  double phi = 0;
  for (uint64_t u : m.units) phi += static_cast<double>(u);
  const double flops =
      training_flops_per_token(phi, g.layers, g.seq_len, g.embd) * 4 * g.seq_len * 2;
  EXPECT_DOUBLE_EQ(fc.time->compute, flops / 1e9);
  // Stage 3 issues every collective during compute at --accumulate reduce.
  EXPECT_EQ(fc.time->comm_serial, 0);
  EXPECT_GT(fc.time->comm_overlap, 0);
  EXPECT_EQ(fc.disk_sharers, 4);  // one machine: every rank reads the one disk
  const double nvme = static_cast<double>(fc.states.nvme);
  EXPECT_DOUBLE_EQ(fc.io, (nvme / 1e8 + nvme / 5e7) * 4);
  EXPECT_DOUBLE_EQ(offload_step_seconds(*fc.time, fc.io, 3, false), fc.time->overlapped() + fc.io);
  EXPECT_EQ(step_bound(*fc.time, fc.io), fc.io > fc.time->compute && fc.io > fc.time->comm() ? "io"
                                         : fc.time->comm() > fc.time->compute ? "comm"
                                                                              : "compute");
  // The reductions issued during backward start once the forward ends: on a slow link HSDP,
  // whose cross-node traffic is all reductions, takes at least forward + reductions.
  TrainConfig hsdp = asked_gpt(g);
  hsdp.launch.comm.node_ranks = 2;
  hsdp.shard_within_node = true;
  const StepInputs slow{.compute_seconds = 0.3, .inter_bandwidth = 1e4};
  const Forecast h = forecast(row_config(hsdp, 4, 3, Offload::kNone), m, slow);
  ASSERT_TRUE(h.time.has_value());
  EXPECT_DOUBLE_EQ(h.time->forward, 0.1);
  EXPECT_GT(h.time->backward_reduce, 0);
  EXPECT_DOUBLE_EQ(h.time->overlapped(),
                   std::max({0.3, h.time->comm_overlap, 0.1 + h.time->backward_reduce}));
  EXPECT_GT(h.time->overlapped(), std::max(0.3, h.time->comm_overlap));
  // Without a model there is nothing to time or lay out.
  const Forecast flat = forecast(c, PlannedModel{.units = m.units}, in);
  EXPECT_FALSE(flat.time.has_value());
  EXPECT_FALSE(flat.transients.has_value());
  EXPECT_EQ(flat.need, flat.states.total());
}

}  // namespace
}  // namespace zerodp
