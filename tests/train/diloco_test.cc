// DiLoCo's islands (train/outer_step.h): the same bits on any ranks per island, the outer
// step's Nesterov form and sign, and what the report and the ledger say of it.
#include <gtest/gtest.h>

#include <fmt/core.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/consolidate.h"
#include "checkpoint/store.h"
#include "core/error.h"
#include "core/sha256.h"
#include "temp_dir.h"
#include "train/forecast.h"
#include "train/plan.h"
#include "train/report.h"
#include "train/setup.h"
#include "train_testing.h"

namespace zerodp {
namespace {

using testing::file_bytes;
using testing::run;
using testing::tiny_config;

constexpr int kIslands = 2;
constexpr int kIslandMicroBatches = 4;

// 2 islands of 4 micro-batches per step on `ranks` ranks in all, the canonical order inside
// each island, clipping active.
TrainConfig island_config(int ranks, int stage, Precision precision = Precision::kBF16) {
  TrainConfig c = tiny_config(ranks, stage, precision);
  c.micro_batch = 2;
  c.grad_accum = kIslandMicroBatches * kIslands / ranks;
  c.accumulate = AccumulatePolicy::kReduce;
  c.invariant = true;
  c.clip = 0.05f;
  c.islands = kIslands;
  c.outer_every = 2;
  c.steps = 5;  // outer steps after 2, 4 and (a partial round) 5
  c.eval_every = 4;
  c.eval_batches = 5;
  return c;
}

struct Outcome {
  std::string weights;
  std::vector<double> losses, norms;
  std::vector<bool> outer;
  std::vector<double> val_losses;
};

Outcome outcome_of(const TrainResult& r) {
  Outcome o;
  o.weights = r.weights_sha256;
  for (const StepRecord& s : r.steps) {
    o.losses.push_back(s.loss);
    o.norms.push_back(s.grad_norm);
    o.outer.push_back(s.outer);
    if (s.val_loss) o.val_losses.push_back(*s.val_loss);
  }
  o.val_losses.push_back(r.val_loss.value_or(std::nan("")));
  return o;
}

TEST(Islands, AnyRanksPerIslandGiveTheSameBitsAtEveryStage) {
  for (Precision p : {Precision::kBF16, Precision::kFP32}) {
    const Outcome want = outcome_of(run(island_config(2, 0, p)));
    EXPECT_EQ(want.outer, (std::vector<bool>{false, true, false, true, true}));
    ASSERT_EQ(want.val_losses.size(), 2u);
    for (int stage = 0; stage <= 3; ++stage) {
      for (int ranks : {2, 4, 8}) {
        if (stage == 0 && ranks == 2) continue;
        const std::string where = fmt::format("{} stage {} on {} ranks ({} per island)",
                                              precision_name(p), stage, ranks, ranks / kIslands);
        const Outcome got = outcome_of(run(island_config(ranks, stage, p)));
        EXPECT_EQ(got.weights, want.weights) << where;
        EXPECT_EQ(got.losses, want.losses) << where;
        EXPECT_EQ(got.norms, want.norms) << where;
        EXPECT_EQ(got.val_losses, want.val_losses) << where;
      }
    }
  }
}

// The islands train apart: their steps are not the synchronous run's.
TEST(Islands, DifferFromOneSynchronousWorld) {
  TrainConfig sync = island_config(4, 1);
  sync.islands = 1;
  sync.eval_every = 0;
  TrainConfig islands = island_config(4, 1);
  islands.eval_every = 0;
  EXPECT_NE(run(sync).weights_sha256, run(islands).weights_sha256);
}

// The fp32 weights after one step, each island's AdamW step then one outer step.
std::vector<float> one_round(float lr, float momentum) {
  TrainConfig c = island_config(2, 1, Precision::kFP32);
  c.steps = 1;
  c.outer_every = 1;
  c.eval_every = 0;
  c.outer_lr = lr;
  c.outer_momentum = momentum;
  c.keep_final_weights = true;
  return run(c).final_weights;
}

// After one round the momentum is the averaged pseudo-gradient d, so Nesterov moves the
// global weights g0 by -lr (1 + mu) d (heavy-ball momentum would move them by -lr d): with
// lr 1 and mu 0 the islands' mean weights, with lr 0.5 and mu 0.9 0.95 of that move.
TEST(Islands, TheOuterStepIsNesterovOnTheAveragedPseudoGradient) {
  TrainConfig init = island_config(2, 1, Precision::kFP32);
  init.steps = 0;
  init.eval_batches = 0;
  init.keep_final_weights = true;
  const std::vector<float> g0 = run(init).final_weights;
  const std::vector<float> mean = one_round(1.0f, 0.0f);
  const std::vector<float> nesterov = one_round(0.5f, 0.9f);
  ASSERT_EQ(g0.size(), mean.size());
  ASSERT_EQ(g0.size(), nesterov.size());
  double moved = 0, off = 0;
  for (size_t i = 0; i < g0.size(); ++i) {
    const double d = static_cast<double>(g0[i]) - mean[i];
    const double want = g0[i] - 0.95 * d;
    moved += d * d;
    off += (nesterov[i] - want) * (nesterov[i] - want);
  }
  ASSERT_GT(moved, 0.0);
  EXPECT_LT(std::sqrt(off), 1e-4 * std::sqrt(moved));
}

// The pseudo-gradient's sign (torchft #233 had it reversed): averaging the islands every
// step must train, so the loss falls as a synchronous run's does.
TEST(Islands, AveragingEveryStepTrains) {
  TrainConfig c = island_config(2, 2);
  c.steps = 30;
  c.outer_every = 1;
  c.outer_lr = 1.0f;
  c.outer_momentum = 0.0f;
  c.eval_every = 0;
  c.clip = 1.0f;
  c.lr = 3e-3f;
  const TrainResult r = run(c);
  EXPECT_LT(r.steps.back().loss, r.steps.front().loss - 0.5)
      << r.steps.front().loss << " -> " << r.steps.back().loss;
}

TEST(Islands, TheReportCountsTheOuterStateAndItsBytes) {
  const TrainResult r = run(island_config(4, 3));
  const nlohmann::json j = report_json(r);
  const nlohmann::json& outer = j["plan"]["comm_bytes_per_outer_step"];
  ASSERT_EQ(outer.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    const nlohmann::json& ranks = j["ranks"][static_cast<size_t>(rank)];
    // The outer state: global weights and momentum of the own range, 8 bytes an element.
    EXPECT_EQ(ranks["peak_bytes"]["outer_state"],
              j["plan"]["model_state_bytes"][static_cast<size_t>(rank)]["outer_state"]);
    EXPECT_GT(ranks["peak_bytes"]["outer_state"].get<uint64_t>(), 0u);
    // Every outer byte crosses islands, and islands are nodes.
    EXPECT_EQ(outer[static_cast<size_t>(rank)]["cross_node_bytes"],
              outer[static_cast<size_t>(rank)]["total"]);
  }
  const std::string table = formula_table(r);
  EXPECT_EQ(table.find("DIFF"), std::string::npos) << table;
  // Stages 0-2 hold whole copies, which a merge gathers again inside the island; streaming
  // merges touch the units their fragment overlaps.
  for (int stage : {0, 1, 2}) {
    for (int fragments : {1, 2}) {
      TrainConfig c = island_config(4, stage);
      c.fragments = fragments;
      c.outer_every = 2;
      c.eval_every = 0;
      const std::string t = formula_table(run(c));
      EXPECT_EQ(t.find("DIFF"), std::string::npos)
          << "stage " << stage << " F=" << fragments << "\n"
          << t;
    }
  }
}

// A checkpoint in the middle of a round holds every island's states and the outer state;
// resumed on other ranks per island and another stage, the run goes on as if never stopped,
// and export writes the global weights: after the last (outer) step, the run's weights.
TEST(Islands, AResumeMidRoundContinuesTheUninterruptedRun) {
  namespace fs = std::filesystem;
  testing::TempDir tmp;
  TrainConfig base = island_config(4, 1);
  base.checkpoint_dir = (tmp.path() / "whole").string();
  base.keep_final_weights = true;
  const TrainResult whole = run(base);
  checkpoint::export_fp32(base.checkpoint_dir, tmp.path() / "whole.safetensors");
  const std::string exported = file_bytes(tmp.path() / "whole.safetensors");
  // The export holds the final weights, fp32, in the model's order.
  std::vector<float> tail(whole.final_weights.end() - 16, whole.final_weights.end());
  EXPECT_NE(exported.find(std::string(reinterpret_cast<const char*>(tail.data()),
                                      tail.size() * sizeof(float))),
            std::string::npos);
  TrainConfig first = base;
  first.checkpoint_dir = (tmp.path() / "first").string();
  first.stop_after = 3;  // one step into the second round
  (void)run(first);
  const checkpoint::Meta meta =
      checkpoint::read_meta(checkpoint::step_dir(first.checkpoint_dir, 3));
  EXPECT_EQ(meta.islands, kIslands);
  EXPECT_EQ(meta.world_size, 2);
  for (int ranks : {2, 8}) {
    const std::string where = fmt::format("resumed on {} ranks", ranks);
    const fs::path dir = tmp.path() / fmt::format("on{}", ranks);
    fs::copy(first.checkpoint_dir, dir, fs::copy_options::recursive);
    TrainConfig next = base;
    next.launch.ranks = ranks;
    next.stage = ranks == 8 ? 3 : 0;
    next.grad_accum = 0;  // derived
    next.checkpoint_dir = dir.string();
    next.resume = "latest";
    const TrainResult r = run(next);
    EXPECT_EQ(r.weights_sha256, whole.weights_sha256) << where;
    ASSERT_EQ(r.steps.size(), 2u) << where;
    // The steps the checkpoint carried keep their outer steps for the report.
    ASSERT_EQ(r.history.size(), 3u) << where;
    EXPECT_TRUE(r.history[1].outer && !r.history[0].outer && !r.history[2].outer) << where;
    for (size_t k = 0; k < r.steps.size(); ++k) {
      EXPECT_EQ(r.steps[k].loss, whole.steps[k + 3].loss) << where << " step " << k + 4;
    }
    const fs::path out = tmp.path() / fmt::format("on{}.safetensors", ranks);
    checkpoint::export_fp32(dir, out);
    EXPECT_EQ(sha256_file_hex(out), sha256_file_hex(tmp.path() / "whole.safetensors")) << where;
  }
  // The islands are the run's: another count is refused.
  TrainConfig other = base;
  other.islands = 4;
  other.checkpoint_dir = (tmp.path() / "other").string();
  fs::copy(first.checkpoint_dir, other.checkpoint_dir, fs::copy_options::recursive);
  other.resume = "latest";
  try {
    (void)run(other);
    ADD_FAILURE() << "4 islands accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("use --islands 2"), std::string::npos) << e.what();
  }
}

// Streaming: 2 fragments, H = 4, each exchange merged a step after it starts.
TrainConfig streaming_config(int ranks, int stage) {
  TrainConfig c = island_config(ranks, stage);
  c.outer_every = 4;
  c.fragments = 2;
  c.outer_delay = 1;
  c.eval_every = 0;
  c.steps = 9;  // fragment 1's rounds end at 2 and 6, fragment 0's at 4 and 8, both at 9
  return c;
}

// 8-bit inner moments (optim/moments8.h): the islands' partitions are cut on the block grid,
// so the bits are the same for any ranks per island and stage, streamed or not; the planner
// counts the outer state and traffic on those partitions (no DIFF in the formula table); and a
// checkpoint mid-round, holding every island's codes and scales, resumes on other ranks.
TEST(Islands, Int8MomentsKeepTheBitsAndResumeMidRound) {
  namespace fs = std::filesystem;
  testing::TempDir tmp;
  TrainConfig base = streaming_config(2, 0);
  base.int8_moments = true;
  base.checkpoint_dir = (tmp.path() / "whole").string();
  const TrainResult whole = run(base);
  TrainConfig fp32 = base;
  fp32.int8_moments = false;
  fp32.checkpoint_dir.clear();
  EXPECT_NE(run(fp32).weights_sha256, whole.weights_sha256) << "the moments must matter";
  TrainConfig c = streaming_config(4, 3);
  c.int8_moments = true;
  c.checkpoint_dir = (tmp.path() / "four").string();
  c.stop_after = 3;  // mid-round, fragment 1's exchange in flight
  (void)run(c);
  c.stop_after = 0;
  c.resume = "latest";
  c.launch.ranks = 8;
  c.stage = 1;
  c.grad_accum = 0;  // the checkpoint's batch
  const TrainResult resumed = run(c);
  EXPECT_EQ(resumed.weights_sha256, whole.weights_sha256);
  const std::string table = formula_table(resumed);
  EXPECT_EQ(table.find("DIFF"), std::string::npos) << table;
  TrainConfig eight = streaming_config(8, 2);
  eight.int8_moments = true;
  const TrainResult r = run(eight);
  EXPECT_EQ(r.weights_sha256, whole.weights_sha256);
  EXPECT_EQ(formula_table(r).find("DIFF"), std::string::npos);
  // A unit of one grain (an MLP's 170-element head) is all rank 0's: a merge's gathers are
  // still every rank's, at stage 0 and at stages 1-2.
  for (int stage : {0, 1}) {
    TrainConfig mlp = island_config(2, stage);
    mlp.model = "mlp";
    mlp.mlp_hidden = 16;
    mlp.int8_moments = true;
    const std::string want = run(mlp).weights_sha256;
    mlp.launch.ranks = 4;
    mlp.grad_accum = kIslandMicroBatches * kIslands / 4;
    EXPECT_EQ(run(mlp).weights_sha256, want) << "MLP stage " << stage;
  }
}

// Islands in turn (--islands-in-turn): every island on all the ranks, one after another,
// gives the bits of the islands on ranks of their own (a cluster's run on fewer ranks), at
// every stage, streamed and with 4-bit outer gradients; each rank holds every island's
// states and one set of buffers.
TEST(Islands, InTurnOnFewerRanksGiveTheClustersBits) {
  const auto in_turn = [](TrainConfig c, int ranks, int stage) {
    c.islands_in_turn = true;
    c.launch.ranks = ranks;
    c.stage = stage;
    c.grad_accum = kIslandMicroBatches / ranks;
    return c;
  };
  for (Precision p : {Precision::kBF16, Precision::kFP32}) {
    const Outcome want = outcome_of(run(island_config(2, 0, p)));
    for (int stage = 0; stage <= 3; ++stage) {
      for (int ranks : {1, 2}) {
        if (p == Precision::kFP32 && ranks == 1 && stage > 0) continue;
        const std::string where = fmt::format("{} stage {}, 2 islands in turn on {} ranks",
                                              precision_name(p), stage, ranks);
        const Outcome got = outcome_of(run(in_turn(island_config(2, 0, p), ranks, stage)));
        EXPECT_EQ(got.weights, want.weights) << where;
        EXPECT_EQ(got.losses, want.losses) << where;
        EXPECT_EQ(got.norms, want.norms) << where;
        EXPECT_EQ(got.val_losses, want.val_losses) << where;
      }
    }
  }
  // Streaming DiLoCo with a delayed merge, and quantized outer gradients.
  for (int bits : {0, 4}) {
    TrainConfig cluster = streaming_config(4, 1);
    cluster.outer_quant = bits;
    const TrainResult whole = run(cluster);
    const TrainResult turn = run(in_turn(cluster, 2, 3));
    EXPECT_EQ(turn.weights_sha256, whole.weights_sha256) << "streaming, outer quant " << bits;
    ASSERT_EQ(turn.steps.size(), whole.steps.size());
    for (size_t i = 0; i < turn.steps.size(); ++i) {
      EXPECT_EQ(turn.steps[i].loss, whole.steps[i].loss) << "step " << i + 1;
      EXPECT_EQ(turn.steps[i].outer, whole.steps[i].outer) << "step " << i + 1;
    }
  }
  // Offloaded: each island's states in a file of its own, streamed through one staging.
  testing::TempDir scratch;
  for (const auto& [stage, precision, offload] :
       {std::tuple{0, Precision::kBF16, Offload::kOptimizer},
        {1, Precision::kFP32, Offload::kOptimizer},
        {3, Precision::kBF16, Offload::kParams}}) {
    TrainConfig c = island_config(4, stage, precision);
    c.offload = offload;
    c.offload_dir = scratch.path().string();
    c.offload_piece = 2048;
    c.offload_overlap = stage == 0;
    const TrainResult cluster = run(c);
    const TrainResult turn = run(in_turn(c, 2, stage));
    const std::string where = fmt::format("offloaded at stage {}", stage);
    EXPECT_EQ(turn.weights_sha256, cluster.weights_sha256) << where;
    EXPECT_EQ(turn.ranks[1].nvme_bytes, 2 * cluster.ranks[1].nvme_bytes) << where;
    EXPECT_EQ(turn.ranks[1].peak[static_cast<int>(MemCategory::kOffloadStaging)],
              cluster.ranks[1].peak[static_cast<int>(MemCategory::kOffloadStaging)])
        << where;
    const std::string table = formula_table(turn);
    EXPECT_EQ(table.find("DIFF"), std::string::npos) << where << "\n" << table;
  }
  // The memory: each rank holds the 2 islands' states, and the buffers of one rank of an
  // island (the cluster's rank with the same index in an island of as many ranks).
  const TrainConfig two = in_turn(island_config(4, 3), 2, 3);
  const TrainResult turn = run(two);
  const TrainResult cluster = run(island_config(4, 3));
  for (size_t r = 0; r < turn.ranks.size(); ++r) {
    for (int k = 0; k <= static_cast<int>(MemCategory::kAdamV); ++k) {
      EXPECT_EQ(turn.ranks[r].model_state[k], 2 * cluster.ranks[r].model_state[k])
          << "rank " << r << " " << mem_category_name(static_cast<MemCategory>(k));
    }
    EXPECT_EQ(turn.ranks[r].peak[static_cast<int>(MemCategory::kActivations)],
              cluster.ranks[r].peak[static_cast<int>(MemCategory::kActivations)]);
  }
  // The planner counts it so: the report's formulas, and estimate's forecast.
  const std::string table = formula_table(turn);
  EXPECT_EQ(table.find("DIFF"), std::string::npos) << table;
  TrainConfig resolved = turn.config;
  const Model model = build_model(resolved);
  PlannedModel m{.model = &model};
  for (const auto& u : model) m.units.push_back(u->numel());
  const Forecast fc = forecast(resolved, m);
  uint64_t states = 0;
  for (int k = 0; k <= static_cast<int>(MemCategory::kAdamV); ++k) {
    states += turn.ranks[0].model_state[k];
  }
  EXPECT_EQ(fc.states.total(), states);
  ASSERT_TRUE(fc.outer);
  EXPECT_EQ(fc.outer->state, turn.ranks[0].peak[static_cast<int>(MemCategory::kOuterState)]);
  EXPECT_EQ(fc.outer->exchange_round.total(), 0u) << "in turn, the islands meet in memory";
}

// A checkpoint of islands in turn is the one the islands on ranks of their own write, shard
// for shard (island v's shards are those of rank v N + r), so either resumes the other; here
// mid-round with an exchange in flight.
TEST(Islands, InTurnCheckpointsAreTheClustersAndResumeEitherWay) {
  namespace fs = std::filesystem;
  testing::TempDir tmp;
  const TrainResult whole = run(streaming_config(4, 3));
  TrainConfig cluster = streaming_config(4, 3);
  cluster.checkpoint_dir = (tmp.path() / "cluster").string();
  cluster.stop_after = 3;  // fragment 1's exchange in flight
  (void)run(cluster);
  TrainConfig turn = cluster;
  turn.islands_in_turn = true;
  turn.launch.ranks = 2;  // 2 islands of 2 ranks in turn on 2 ranks
  turn.checkpoint_dir = (tmp.path() / "turn").string();
  (void)run(turn);
  const fs::path a = checkpoint::step_dir(cluster.checkpoint_dir, 3);
  const fs::path b = checkpoint::step_dir(turn.checkpoint_dir, 3);
  const checkpoint::Meta meta = checkpoint::read_meta(b);
  ASSERT_EQ(meta.shard_files(), 4);
  for (int r = 0; r < meta.shard_files(); ++r) {
    const std::string name = checkpoint::rank_file_name(r);
    EXPECT_EQ(sha256_file_hex(b / name), sha256_file_hex(a / name)) << name;
  }
  // The cluster's checkpoint continued in turn on one rank, and the one in turn on the
  // cluster's four.
  for (const auto& [from, ranks, in_turn] :
       {std::tuple{cluster.checkpoint_dir, 1, true}, {turn.checkpoint_dir, 4, false}}) {
    TrainConfig next = streaming_config(ranks, 1);
    next.islands_in_turn = in_turn;
    next.grad_accum = 0;  // the checkpoint's batch
    next.checkpoint_dir = (tmp.path() / fmt::format("next{}", ranks)).string();
    fs::copy(from, next.checkpoint_dir, fs::copy_options::recursive);
    next.resume = "latest";
    const TrainResult r = run(next);
    EXPECT_EQ(r.weights_sha256, whole.weights_sha256) << "resumed on " << ranks;
    ASSERT_EQ(r.steps.size(), whole.steps.size() - 3);
    for (size_t k = 0; k < r.steps.size(); ++k) {
      EXPECT_EQ(r.steps[k].loss, whole.steps[k + 3].loss) << "step " << k + 4;
    }
  }
}

// --hpz inside islands: each island keeps its node's copy of stage 3's gathered parameters,
// over the ranks it shares a node with (the island's own when it is part of a node), so the
// bits are the islands' without it; the copy is what the planner counts (no DIFF).
TEST(Islands, HpzKeepsTheBitsAndItsCopyIsPlanned) {
  // ranks, ranks per node: islands of 4 over nodes of 2 (an island is two nodes), of 2 in
  // nodes of 2, and of 2 in nodes of 4 (two islands per node).
  for (const auto& [ranks, per_node] : {std::pair{8, 2}, {4, 2}, {4, 4}}) {
    TrainConfig c = island_config(ranks, 3);
    c.launch.comm.node_ranks = per_node;
    const std::string where = fmt::format("{} ranks, nodes of {}", ranks, per_node);
    const TrainResult plain = run(c);
    c.hpz = true;
    const TrainResult hpz = run(c);
    EXPECT_EQ(hpz.weights_sha256, plain.weights_sha256) << where;
    const int n = ranks / kIslands;
    const int shares = std::min(n, per_node);
    for (size_t r = 0; r < hpz.ranks.size(); ++r) {
      uint64_t copy = 0;
      for (uint64_t numel : hpz.unit_numel) {
        copy += Partition(numel, shares).count(static_cast<int>(r) % n % shares) * 2;
      }
      EXPECT_EQ(hpz.ranks[r].peak[static_cast<int>(MemCategory::kHpzParams)], copy)
          << where << " rank " << r;
    }
    const std::string table = formula_table(hpz);
    EXPECT_EQ(table.find("DIFF"), std::string::npos) << where << "\n" << table;
  }
}

// --offload: the outer step reads and writes the master (and the 16-bit params it rounds
// into) through the offload file; the run is the in-memory one, bit for bit, streamed or not,
// and resumes mid-round from its checkpoint.
TEST(Islands, OffloadedStatesGiveTheInMemoryBits) {
  testing::TempDir tmp;
  struct Case {
    TrainConfig config;
    Offload offload;
    const char* name;
  };
  // Streamed with a delay, a merge mixes the island's own master in (--outer-mix 0.5).
  const TrainConfig stage1 = streaming_config(4, 1);
  const std::vector<Case> cases{
      {stage1, Offload::kOptimizer, "streaming, stage 1 bf16"},
      {island_config(4, 3), Offload::kParams, "stage 3 bf16, params offloaded"},
      {island_config(2, 0, Precision::kFP32), Offload::kOptimizer, "stage 0 fp32"},
      // The island's whole master is in each rank's file: a merge gathers it unit by unit.
      {island_config(4, 0), Offload::kOptimizer, "stage 0 bf16, 2 ranks per island"}};
  for (const Case& k : cases) {
    const TrainResult memory = run(k.config);
    TrainConfig c = k.config;
    c.offload = k.offload;
    c.offload_dir = tmp.path().string();
    c.offload_piece = 2048;  // several pieces per unit, fragments cutting them
    const TrainResult disk = run(c);
    EXPECT_EQ(disk.weights_sha256, memory.weights_sha256) << k.name;
    EXPECT_EQ(outcome_of(disk).losses, outcome_of(memory).losses) << k.name;
    EXPECT_EQ(disk.ranks[0].model_state[static_cast<int>(MemCategory::kMaster)], 0u) << k.name;
    const std::string table = formula_table(disk);
    EXPECT_EQ(table.find("DIFF"), std::string::npos) << k.name << "\n" << table;
    const nlohmann::json j = report_json(disk);
    for (size_t rank = 0; rank < disk.ranks.size(); ++rank) {
      EXPECT_EQ(j["ranks"][rank]["peak_bytes"]["outer_state"],
                j["plan"]["model_state_bytes"][rank]["outer_state"])
          << k.name << " rank " << rank;
    }
  }
  TrainConfig c = stage1;
  c.offload = Offload::kOptimizer;
  c.offload_dir = tmp.path().string();
  c.offload_piece = 2048;
  c.checkpoint_dir = (tmp.path() / "ckpt").string();
  c.stop_after = 3;  // an exchange in flight
  (void)run(c);
  c.stop_after = 0;
  c.resume = "latest";
  EXPECT_EQ(run(c).weights_sha256, run(stage1).weights_sha256);
}

TEST(Streaming, AnyRanksPerIslandGiveTheSameBits) {
  const TrainResult want = run(streaming_config(2, 1));
  std::vector<bool> outer;
  for (const StepRecord& s : want.steps) outer.push_back(s.outer);
  // Exchanges start after 2, 4, 6, 8 and merge a step later; the last step does both.
  EXPECT_EQ(outer, (std::vector<bool>{false, true, true, true, true, true, true, true, true}));
  for (int stage : {0, 3}) {
    for (int ranks : {4, 8}) {
      const TrainResult got = run(streaming_config(ranks, stage));
      EXPECT_EQ(got.weights_sha256, want.weights_sha256) << "stage " << stage << " " << ranks;
    }
  }
  // Not DiLoCo's bits: the fragments' rounds and the delayed merges change the training.
  TrainConfig whole = streaming_config(2, 1);
  whole.fragments = 1;
  whole.outer_delay = 0;
  EXPECT_NE(run(whole).weights_sha256, want.weights_sha256);
  EXPECT_EQ(formula_table(want).find("DIFF"), std::string::npos) << formula_table(want);
}

// A checkpoint taken while fragment 1's exchange is in flight (sent after step 6, merged
// after 7) holds it; the resume merges it on time, with the uninterrupted run's bits.
TEST(Streaming, AResumeWithAnExchangeInFlightContinuesTheUninterruptedRun) {
  namespace fs = std::filesystem;
  testing::TempDir tmp;
  TrainConfig base = streaming_config(4, 2);
  base.checkpoint_dir = (tmp.path() / "whole").string();
  const TrainResult whole = run(base);
  TrainConfig first = base;
  first.checkpoint_dir = (tmp.path() / "first").string();
  first.stop_after = 6;
  (void)run(first);
  const checkpoint::Checkpoint saved(checkpoint::step_dir(first.checkpoint_dir, 6));
  EXPECT_TRUE(saved.holds("outer_pending"));
  for (int ranks : {2, 8}) {
    const fs::path dir = tmp.path() / fmt::format("on{}", ranks);
    fs::copy(first.checkpoint_dir, dir, fs::copy_options::recursive);
    TrainConfig next = base;
    next.launch.ranks = ranks;
    next.grad_accum = 0;
    next.checkpoint_dir = dir.string();
    next.resume = "latest";
    const TrainResult r = run(next);
    EXPECT_EQ(r.weights_sha256, whole.weights_sha256) << ranks;
  }
  // The schedule is the checkpoint's.
  TrainConfig other = base;
  other.outer_delay = 0;
  other.checkpoint_dir = (tmp.path() / "other").string();
  fs::copy(first.checkpoint_dir, other.checkpoint_dir, fs::copy_options::recursive);
  other.resume = "latest";
  try {
    (void)run(other);
    ADD_FAILURE() << "another --outer-delay accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("use --outer-delay 1"), std::string::npos) << e.what();
  }
}

// A run that stops while an exchange is in flight (after step 6, merged after 7) ends
// cleanly: the exchange finishes into its buffer before the buffer goes (ASan runs this).
TEST(Streaming, AStopWithAnExchangeInFlightEndsCleanly) {
  TrainConfig c = streaming_config(4, 3);
  c.stop_after = 6;
  const TrainResult r = run(c);
  ASSERT_EQ(r.steps.size(), 6u);
  EXPECT_TRUE(r.steps.back().outer);
}

// Each exchange moves about 1/F of a round's bytes: the burst a link sees.
TEST(Streaming, AnExchangeMovesAFragmentOfTheRound) {
  TrainConfig c = streaming_config(4, 3);
  c.outer_every = 8;
  c.fragments = 4;
  const std::vector<uint64_t> numel{1000, 4096, 4096, 4096, 4096, 300};
  const IslandLayout l = island_layout(c, 4);
  for (int rank = 0; rank < 4; ++rank) {
    uint64_t round = 0, burst = 0;
    for (int f = 0; f < 4; ++f) {
      const uint64_t b = outer_step_bytes(numel, l, rank, f).total();
      round += b;
      burst = std::max(burst, b);
    }
    TrainConfig one = c;
    one.fragments = 1;
    EXPECT_EQ(round, outer_step_bytes(numel, island_layout(one, 4), rank).total());
    EXPECT_LE(static_cast<double>(burst), 1.25 / 4 * static_cast<double>(round)) << rank;
  }
}

// Quantized outer gradients (--outer-quant): blocks fixed in the model's coordinates, so
// a block's scale is the same whatever ranks hold its parts, and so are the bits.
TEST(QuantizedOuterGradients, AnyRanksPerIslandGiveTheSameBits) {
  for (int bits : {8, 4}) {
    TrainConfig base = island_config(2, 1);
    base.outer_quant = bits;
    base.eval_every = 0;
    const TrainResult want = run(base);
    TrainConfig fp32 = base;
    fp32.outer_quant = 0;
    const TrainResult exact = run(fp32);
    // Quantized, not fp32's bits, and close to them: the codes round each block to
    // 1/(2 qmax) of its largest element.
    EXPECT_NE(want.weights_sha256, exact.weights_sha256) << bits;
    EXPECT_NEAR(want.steps.back().loss, exact.steps.back().loss, bits == 8 ? 2e-3 : 2e-2) << bits;
    for (int stage : {0, 3}) {
      for (int ranks : {4, 8}) {
        TrainConfig c = base;
        c.stage = stage;
        c.launch.ranks = ranks;
        c.grad_accum = kIslandMicroBatches * kIslands / ranks;
        const TrainResult got = run(c);
        EXPECT_EQ(got.weights_sha256, want.weights_sha256)
            << "int" << bits << " stage " << stage << " on " << ranks;
        if (ranks == 8) {
          EXPECT_EQ(formula_table(got).find("DIFF"), std::string::npos) << formula_table(got);
          const nlohmann::json j = report_json(got);
          EXPECT_EQ(j["ranks"][5]["peak_bytes"]["outer_state"],
                    j["plan"]["model_state_bytes"][5]["outer_state"]);
        }
      }
    }
  }
}

// Streaming with int4 outer gradients and a checkpoint with an exchange in flight: it holds
// the folded average, and the resume on other ranks continues the uninterrupted run.
TEST(QuantizedOuterGradients, AResumeWithAnExchangeInFlightContinuesTheRun) {
  namespace fs = std::filesystem;
  testing::TempDir tmp;
  TrainConfig base = streaming_config(4, 3);
  base.outer_quant = 4;
  base.checkpoint_dir = (tmp.path() / "whole").string();
  const TrainResult whole = run(base);
  EXPECT_EQ(formula_table(whole).find("DIFF"), std::string::npos) << formula_table(whole);
  TrainConfig other = base;
  other.launch.ranks = 8;
  other.grad_accum = 1;
  other.checkpoint_dir.clear();
  EXPECT_EQ(run(other).weights_sha256, whole.weights_sha256);
  TrainConfig first = base;
  first.checkpoint_dir = (tmp.path() / "first").string();
  first.stop_after = 6;
  (void)run(first);
  TrainConfig next = base;
  next.launch.ranks = 2;
  next.grad_accum = 0;
  next.checkpoint_dir = first.checkpoint_dir;
  next.resume = "latest";
  EXPECT_EQ(run(next).weights_sha256, whole.weights_sha256);
}

// A streaming exchange at int4 moves about an eighth of fp32's over the column, scales
// included.
TEST(QuantizedOuterGradients, CutTheColumnsBytes) {
  TrainConfig c = streaming_config(4, 3);
  const std::vector<uint64_t> numel{1000, 4096, 4096, 4096, 4096, 300};
  const IslandLayout fp32 = island_layout(c, 4);
  for (int bits : {8, 4}) {
    c.outer_quant = bits;
    const IslandLayout q = island_layout(c, 4);
    for (int rank = 0; rank < 4; ++rank) {
      const double plain = static_cast<double>(outer_round_bytes(numel, fp32, rank).cross_total());
      const double cut = static_cast<double>(outer_round_bytes(numel, q, rank).cross_total());
      const double want = bits == 8 ? 1.0 / 4 : 1.0 / 8;
      EXPECT_GT(cut, want * plain * 0.99) << bits << " " << rank;
      EXPECT_LT(cut, want * plain * 1.1) << bits << " " << rank;
    }
  }
}

// estimate's forecast of an island run is what the run measures: the outer state, the
// states and the traffic per step (a round every H steps, spread over them).
// Parameters: the stage, and --outer-quant's bits (0: fp32).
class IslandForecast : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(IslandForecast, IsWhatTheRunMeasures) {
  TrainConfig c = island_config(4, std::get<0>(GetParam()));
  c.outer_quant = std::get<1>(GetParam());
  c.steps = 4;  // rounds end after steps 2 and 4: two rounds over four steps
  c.eval_every = 0;
  const TrainResult r = run(c);
  TrainConfig resolved = r.config;
  const Model model = build_model(resolved);
  PlannedModel m{.model = &model,
                 .layers = resolved.layers,
                 .seq_len = resolved.seq_len,
                 .embd = resolved.embd};
  for (const auto& u : model) m.units.push_back(u->numel());
  const Forecast fc = forecast(resolved, m);
  ASSERT_TRUE(fc.outer);
  const RankSummary& rank0 = r.ranks[0];
  EXPECT_EQ(fc.outer->state, rank0.peak[static_cast<int>(MemCategory::kOuterState)]);
  uint64_t states = 0, comm = 0, cross = 0;
  for (int k = 0; k <= static_cast<int>(MemCategory::kAdamV); ++k) states += rank0.model_state[k];
  EXPECT_EQ(fc.states.total(), states);
  for (int k = 0; k < kNumCommKinds; ++k) {
    if (static_cast<CommKind>(k) == CommKind::kControl) continue;
    comm += rank0.comm_train[k].bytes;
    cross += rank0.comm_train[k].cross_node_bytes;
  }
  // The round's share per step is rounded down to whole bytes.
  EXPECT_NEAR(static_cast<double>(fc.comm.total()), static_cast<double>(comm) / 4, 1.0);
  EXPECT_NEAR(static_cast<double>(fc.comm.cross_total()), static_cast<double>(cross) / 4, 1.0);
  EXPECT_GT(cross, 0u);
  // At a link between nodes, H is advised from the round's time against the steps'.
  StepInputs in{.compute_seconds = 0.1, .inter_bandwidth = 1e6};
  const Forecast timed = forecast(resolved, m, in);
  ASSERT_TRUE(timed.outer && timed.outer->round_seconds && timed.outer->advised_every);
  const double inner = 0.1;  // compute bounds the inner step: inside an island no link is set
  const auto h = static_cast<double>(*timed.outer->advised_every);
  EXPECT_GE(h * 0.1 * inner, *timed.outer->round_seconds * 0.999);
  EXPECT_LT((h - 1) * 0.1 * inner, *timed.outer->round_seconds);
}

INSTANTIATE_TEST_SUITE_P(Stages, IslandForecast,
                         ::testing::Combine(::testing::Values(0, 3), ::testing::Values(0, 4)));

// A rank that fails mid-run: the islands go on from the last checkpoint on fewer ranks each
// (2 islands of 2 -> of 1), keeping every island and its batch: the uninterrupted run's bits.
TEST(Islands, AnElasticRestartKeepsTheIslands) {
  testing::TempDir whole_dir, elastic_dir;
  TrainConfig w = island_config(4, 2);
  w.eval_every = 0;
  w.checkpoint_dir = (whole_dir.path() / "ck").string();
  w.checkpoint_every = 2;
  const TrainResult whole = run(w);
  TrainConfig c = w;
  c.checkpoint_dir = (elastic_dir.path() / "ck").string();
  c.max_restarts = 1;
  c.inject = {parse_injection("throw@4:3")};
  const TrainResult r = run(c);
  ASSERT_EQ(r.restarts.size(), 1u);
  EXPECT_EQ(r.restarts[0].ranks_before, 4);
  EXPECT_EQ(r.restarts[0].ranks_after, 2);
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.weights_sha256, whole.weights_sha256);
  // Islands in turn on 2 ranks go on in turn on 1.
  TrainConfig turn = c;
  turn.islands_in_turn = true;
  turn.launch.ranks = 2;
  turn.checkpoint_dir = (elastic_dir.path() / "turn").string();
  turn.inject = {parse_injection("throw@4:1")};
  const TrainResult t = run(turn);
  ASSERT_EQ(t.restarts.size(), 1u);
  EXPECT_EQ(t.restarts[0].ranks_after, 1);
  EXPECT_EQ(t.weights_sha256, whole.weights_sha256);
  // Islands of one rank have none to lose.
  TrainConfig single = c;
  single.launch.ranks = 2;
  single.grad_accum = 4;
  single.checkpoint_dir = (elastic_dir.path() / "single").string();
  single.inject = {parse_injection("throw@4:1")};
  try {
    (void)run(single);
    ADD_FAILURE() << "islands of one rank restarted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a restart keeps every island"), std::string::npos)
        << e.what();
  }
}

TEST(Islands, RefusalsNameWhatWouldWork) {
  const auto refused = [](TrainConfig c, const std::string& expect) {
    try {
      (void)run(c);
      ADD_FAILURE() << "not refused: " << expect;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  };
  TrainConfig c = island_config(4, 1);
  c.launch.ranks = 6;
  c.grad_accum = 1;
  c.islands = 4;
  refused(c, "--islands 4 does not divide --ranks 6");
  c = island_config(4, 1);
  c.eval_every = 3;
  refused(c, "use a multiple of 2");
  c = island_config(4, 1);
  c.shard_within_node = true;
  refused(c, "--shard-within-node");
  c = streaming_config(4, 1);
  c.fragments = 3;
  refused(c, "--fragments 3 does not divide --outer-every 4");
  c = streaming_config(4, 1);
  c.outer_delay = 2;
  refused(c, "use at most 1");
  c = streaming_config(4, 1);
  c.eval_every = 4;
  refused(c, "leave --eval-every out");
  // Islands in turn: several islands, and what they do not do yet.
  c = island_config(2, 1);
  c.islands_in_turn = true;
  c.islands = 1;
  refused(c, "Use --islands 2 or more");
}

}  // namespace
}  // namespace zerodp
