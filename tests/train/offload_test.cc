// --offload optimizer[,params]: the run is the in-memory run, bit for bit, whatever the stage,
// rank count, precision or piece size; checkpoints cross between offloaded and in-memory runs;
// memory holds what the planner says (no master or moments, at stage 3 with params no
// parameter shards; the staging) and the disk the rest; a directory that cannot hold the
// states is refused before anything is allocated.
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "checkpoint/store.h"
#include "checkpoint_testing.h"
#include "core/error.h"
#include "models/model.h"
#include "temp_dir.h"
#include "train/plan.h"
#include "train/setup.h"
#include "train_testing.h"

namespace zerodp {
namespace {

namespace fs = std::filesystem;
using testing::run;
using testing::TempDir;
using testing::tiny_config;

struct Case {
  int ranks;
  int stage;
  Precision precision;
  int grad_accum;
  uint64_t piece;  // elements per staged piece (0 = the default: one piece per tiny unit)
  Offload offload = Offload::kOptimizer;
  bool int8 = false;  // --optimizer-states int8: the file holds the moments' codes
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << fmt::format("N={} stage {} {} A={} piece {} offload {}{}", c.ranks, c.stage,
                     precision_name(c.precision), c.grad_accum, c.piece, offload_name(c.offload),
                     c.int8 ? " int8" : "");
}

std::vector<double> losses(const TrainResult& r) {
  std::vector<double> v;
  for (const auto& s : r.steps) v.push_back(s.loss);
  return v;
}

std::vector<double> norms(const TrainResult& r) {
  std::vector<double> v;
  for (const auto& s : r.steps) v.push_back(s.grad_norm);
  return v;
}

std::vector<uint64_t> unit_numel(TrainConfig c) {
  resolve_config(c);
  std::vector<uint64_t> v;
  for (const auto& u : build_model(c)) v.push_back(u->numel());
  return v;
}

bool dir_is_empty(const fs::path& p) {
  return fs::directory_iterator(p) == fs::directory_iterator();
}

class SameBits : public ::testing::TestWithParam<Case> {};

TEST_P(SameBits, AsTheInMemoryRunAndOnlyParamsAndGradsInMemory) {
  const Case p = GetParam();
  TempDir tmp;
  TrainConfig c = tiny_config(p.ranks, p.stage, p.precision);
  c.grad_accum = p.grad_accum;
  c.steps = 4;
  c.eval_every = 2;  // an evaluation between steps waits for an overlapped update
  c.int8_moments = p.int8;
  const TrainResult memory = run(c);
  c.offload = p.offload;
  c.offload_dir = tmp.path().string();
  c.offload_piece = p.piece;
  // Where it applies (stages 0 and 3, without parameters); stages 1-2 ignore it.
  c.offload_overlap = p.offload == Offload::kOptimizer;
  const TrainResult disk = run(c);
  EXPECT_EQ(losses(disk), losses(memory));
  EXPECT_EQ(norms(disk), norms(memory));
  EXPECT_EQ(disk.weights_sha256, memory.weights_sha256);
  EXPECT_TRUE(dir_is_empty(tmp.path())) << "the scratch files are unlinked at once";

  const std::vector<uint64_t> numel = unit_numel(c);
  const UnitTensors tensors = disk.unit_tensors;
  uint64_t moved = 0;
  for (const RankSummary& r : disk.ranks) {
    const StateBytes plan =
        model_state_bytes(numel, p.ranks, p.stage, p.precision, r.rank, fp32_accumulator(c),
                          p.offload, p.int8 ? &tensors : nullptr);
    const auto at = [&](MemCategory k) { return r.model_state[static_cast<int>(k)]; };
    EXPECT_EQ(at(MemCategory::kMaster), 0u);
    // 8-bit moments keep their block scales and the small tensors' fp32 moments in memory.
    EXPECT_EQ(at(MemCategory::kAdamM), plan.adam_m);
    EXPECT_EQ(at(MemCategory::kAdamV), plan.adam_v);
    EXPECT_EQ(plan.adam_m > 0, p.int8);
    EXPECT_EQ(at(MemCategory::kParams), plan.params);
    if (p.offload == Offload::kParams) {
      EXPECT_EQ(at(MemCategory::kParams), 0u);
    }
    EXPECT_EQ(at(MemCategory::kGrads), plan.grads);
    EXPECT_EQ(r.nvme_bytes, plan.nvme) << "rank " << r.rank;
    EXPECT_GT(r.peak[static_cast<int>(MemCategory::kOffloadStaging)], 0u);
    // Every step reads and writes the whole file once (the 16-bit parameters: written by the
    // update, read by every gather); initialization writes the master.
    EXPECT_GE(r.offload_bytes_read, 4 * plan.nvme);
    EXPECT_GE(r.offload_bytes_written, 4 * plan.nvme);
    moved += r.offload_bytes_read;
    // The updates' share, the tier's disk rate: every update reads and writes the optimizer's
    // regions whole (and writes the 16-bit parameters' without reading them; at fp32 they are
    // the master).
    uint64_t updates = 0;
    for (const auto& s : disk.steps) updates += s.skipped ? 0 : 1;
    if (p.offload == Offload::kOptimizer || p.precision == Precision::kFP32) {
      EXPECT_EQ(r.offload_update_bytes, 2 * updates * plan.nvme) << "rank " << r.rank;
    } else {
      EXPECT_LT(r.offload_update_bytes, 2 * updates * plan.nvme) << "rank " << r.rank;
      EXPECT_GT(r.offload_update_bytes, updates * plan.nvme) << "rank " << r.rank;
    }
    EXPECT_GT(r.offload_update_seconds, 0) << "rank " << r.rank;
  }
  EXPECT_GT(moved, 0u);
  // The in-memory run holds the same states in memory, and nothing on disk.
  for (const RankSummary& r : memory.ranks) EXPECT_EQ(r.nvme_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, SameBits,
    ::testing::Values(Case{1, 0, Precision::kBF16, 1, 0}, Case{2, 0, Precision::kFP32, 1, 1024},
                      Case{2, 1, Precision::kFP16, 2, 1024}, Case{3, 2, Precision::kBF16, 1, 2048},
                      Case{2, 3, Precision::kBF16, 1, 1024}, Case{3, 3, Precision::kFP32, 2, 0},
                      // The parameter shards on disk too, read before every gather.
                      Case{1, 3, Precision::kBF16, 1, 0, Offload::kParams},
                      Case{2, 3, Precision::kFP16, 2, 2048, Offload::kParams},
                      Case{3, 3, Precision::kFP32, 1, 1024, Offload::kParams},
                      Case{3, 3, Precision::kBF16, 2, 4096, Offload::kParams},
                      // 8-bit moments: their codes in one-byte regions.
                      Case{2, 1, Precision::kBF16, 1, 4096, Offload::kOptimizer, true},
                      Case{2, 0, Precision::kFP16, 2, 0, Offload::kOptimizer, true},  // overlap
                      Case{3, 3, Precision::kFP32, 2, 0, Offload::kParams, true}));

// At stages 0 and 3 with --offload-overlap the update runs beside the next forward;
// the bits are the same, and so is the time counted (every update inside some step).
TEST(Overlap, OnAndOffGiveTheSameBits) {
  TempDir tmp;
  for (const int stage : {0, 3}) {
    TrainConfig c = tiny_config(2, stage);
    c.steps = 5;
    c.offload = Offload::kOptimizer;
    c.offload_dir = tmp.path().string();
    c.offload_piece = 1024;
    c.offload_overlap = true;
    const TrainResult on = run(c);
    c.offload_overlap = false;
    const TrainResult off = run(c);
    EXPECT_EQ(losses(on), losses(off)) << "stage " << stage;
    EXPECT_EQ(on.weights_sha256, off.weights_sha256) << "stage " << stage;
    for (const RankSummary& r : on.ranks) {
      EXPECT_EQ(r.offload_bytes_read, off.ranks[static_cast<size_t>(r.rank)].offload_bytes_read);
      EXPECT_EQ(r.offload_bytes_written,
                off.ranks[static_cast<size_t>(r.rank)].offload_bytes_written);
    }
  }
}

// With the parameter shards on disk, a shard is read into its gather slot once the slot is
// free and gathered one release later: every --prefetch, hpZ's backward gathers from the
// node's copy in memory (the forward's still read the file) and shards sharded within
// nodes give the in-memory run's bits; the ranks' collectives stay in one order.
TEST(ParameterOffload, EveryPrefetchHpzAndHsdpGiveTheInMemoryBits) {
  TempDir tmp;
  const auto check = [&](TrainConfig c, const std::string& where) {
    c.steps = 3;
    c.grad_accum = 2;
    const TrainResult memory = run(c);
    c.offload = Offload::kParams;
    c.offload_dir = tmp.path().string();
    c.offload_piece = 2048;
    const TrainResult disk = run(c);
    EXPECT_EQ(losses(disk), losses(memory)) << where;
    EXPECT_EQ(disk.weights_sha256, memory.weights_sha256) << where;
    for (const RankSummary& r : disk.ranks) {
      EXPECT_EQ(r.model_state[static_cast<int>(MemCategory::kParams)], 0u) << where;
    }
  };
  for (const int prefetch : {0, 2, 3}) {
    TrainConfig c = tiny_config(3, 3);
    c.prefetch = prefetch;
    check(c, fmt::format("prefetch {}", prefetch));
  }
  TrainConfig c = tiny_config(4, 3);
  c.launch.comm.node_ranks = 2;
  c.hpz = true;
  check(c, "hpZ, 2 x 2");
  c.hpz = false;
  c.shard_within_node = true;
  check(c, "HSDP, 2 x 2");
}

struct Crossing {
  int ranks;
  int stage;
  Offload saved;
  Offload resumed;
  Precision precision = Precision::kBF16;
  bool int8 = false;
};

void PrintTo(const Crossing& c, std::ostream* os) {
  *os << fmt::format("N={} stage {} {} saved offloading {} resumed offloading {}{}", c.ranks,
                     c.stage, precision_name(c.precision), offload_name(c.saved),
                     offload_name(c.resumed), c.int8 ? " int8" : "");
}

class Checkpoints : public ::testing::TestWithParam<Crossing> {};

// A checkpoint is the same bytes whichever tier held the states, and a continuation in
// either tier is the run that never stopped.
TEST_P(Checkpoints, CrossBetweenTiers) {
  const Crossing p = GetParam();
  TempDir tmp;
  TrainConfig c = tiny_config(p.ranks, p.stage, p.precision);
  c.steps = 6;
  c.checkpoint_every = 3;
  c.offload_dir = tmp.path().string();
  c.offload_piece = p.int8 ? 4096 : 2048;
  c.int8_moments = p.int8;
  c.checkpoint_dir = (tmp.path() / "memory").string();
  const TrainResult full = run(c);

  TrainConfig saving = c;
  saving.offload = p.saved;
  saving.checkpoint_dir = (tmp.path() / "saved").string();
  saving.stop_after = 3;
  (void)run(saving);
  EXPECT_EQ(testing::checkpoint_states(tmp.path() / "saved"),
            testing::checkpoint_states(tmp.path() / "memory" / checkpoint::step_dir_name(3)));

  TrainConfig resuming = c;
  resuming.offload = p.resumed;
  resuming.checkpoint_dir = (tmp.path() / "saved").string();
  resuming.resume = "latest";
  const TrainResult cont = run(resuming);
  EXPECT_EQ(cont.weights_sha256, full.weights_sha256);
  const std::vector<double> all = losses(full);
  EXPECT_EQ(losses(cont), std::vector<double>(all.begin() + 3, all.end()));
  EXPECT_EQ(testing::checkpoint_states(tmp.path() / "saved"),
            testing::checkpoint_states(tmp.path() / "memory"));
}

INSTANTIATE_TEST_SUITE_P(
    Tiers, Checkpoints,
    ::testing::Values(Crossing{3, 0, Offload::kOptimizer, Offload::kNone},
                      Crossing{2, 1, Offload::kNone, Offload::kOptimizer},
                      Crossing{3, 3, Offload::kOptimizer, Offload::kOptimizer},
                      Crossing{1, 0, Offload::kOptimizer, Offload::kOptimizer},
                      Crossing{2, 3, Offload::kParams, Offload::kNone},
                      Crossing{3, 3, Offload::kNone, Offload::kParams},
                      Crossing{2, 3, Offload::kParams, Offload::kOptimizer, Precision::kFP16},
                      Crossing{3, 3, Offload::kParams, Offload::kParams, Precision::kFP32},
                      // The codes in the file are a shard's, 0 at the fp32 tensors' elements.
                      Crossing{2, 1, Offload::kOptimizer, Offload::kNone, Precision::kBF16, true},
                      Crossing{3, 3, Offload::kNone, Offload::kParams, Precision::kBF16, true}));

TEST(OffloadRefusals, ADirectoryThatCannotHoldTheStatesIsRefusedBeforeAnyRankStarts) {
  TempDir tmp;
  TrainConfig c = tiny_config(1, 0);
  c.offload = Offload::kOptimizer;
  c.offload_dir = (tmp.path() / "missing").string();
  EXPECT_THROW(
      {
        try {
          run(c);
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidArgument);
  // A GPT of about 100 billion parameters: 1.2 TB of optimizer states, past any test disk.
  c.offload_dir = tmp.path().string();
  c.layers = 32;
  c.embd = 16384;
  c.heads = 128;
  c.memory_per_rank.reset();
  try {
    run(c);
    ADD_FAILURE() << "a run whose states cannot fit the disk started";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("free, but"), std::string::npos) << what;
    EXPECT_NE(what.find(tmp.path().string()), std::string::npos) << what;
  }
  EXPECT_TRUE(dir_is_empty(tmp.path()));
}

// Each refusal names the flag at fault.
void expect_refused(TrainConfig c, const std::string& named) {
  try {
    resolve_config(c);
    ADD_FAILURE() << "accepted; expected a refusal naming " << named;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
  }
}

TEST(OffloadRefusals, WhatOffloadCannotBeCombinedWith) {
  TrainConfig c = tiny_config(2, 3);
  c.offload = Offload::kOptimizer;
  c.qwz = true;
  expect_refused(c, "--qwz");
  c.qwz = false;
  c.offload_piece = 1000;
  expect_refused(c, "--offload-piece 1000");
  // Parameters: only stage 3 shards them; their 2-byte blocks need 2048-element pieces; the
  // overlapped update would write shards the next forward reads.
  c.offload = Offload::kParams;
  c.offload_piece = 3072;
  expect_refused(c, "multiple of 2048");
  c.offload_piece = 0;
  c.offload_overlap = true;
  expect_refused(c, "--offload-overlap");
  c.offload_overlap = false;
  c.qwz = true;
  expect_refused(c, "--qwz");
  c.qwz = false;
  c.stage = 2;
  expect_refused(c, "--stage 3");
  c.stage = 3;
  EXPECT_NO_THROW(resolve_config(c));
  EXPECT_THROW(parse_offload("params"), InvalidArgument);
  EXPECT_EQ(parse_offload("optimizer,params"), Offload::kParams);
}

TEST(OffloadBudget, ABudgetOnlyOffloadMeetsTrainsAndTheAdviceSaysSo) {
  TempDir tmp;
  TrainConfig c = tiny_config(2, 3);
  // Small pieces: with the default, the tiny model's staging would cost about what offload
  // saves.
  c.offload_piece = 1024;
  const std::vector<uint64_t> numel = unit_numel(c);
  // Between what stage 3 needs in memory with and without offload, plus room for the rest.
  const uint64_t with =
      max_model_state_bytes(numel, 2, 3, c.precision, false, Offload::kOptimizer).total();
  const uint64_t without = max_model_state_bytes(numel, 2, 3, c.precision).total();
  ASSERT_LT(with, without);
  const TrainResult probe = [&] {
    TrainConfig o = c;
    o.offload = Offload::kOptimizer;
    o.offload_dir = tmp.path().string();
    return run(o);
  }();
  const uint64_t transient = probe.ranks[0].peak_total - with;
  c.memory_per_rank = with + transient + (without - with) / 2;
  try {
    run(c);
    ADD_FAILURE() << "the budget admitted the in-memory run";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("--offload optimizer"), std::string::npos) << e.what();
  }
  c.offload = Offload::kOptimizer;
  c.offload_dir = tmp.path().string();
  const TrainResult ok = run(c);
  EXPECT_EQ(ok.weights_sha256, probe.weights_sha256);
  EXPECT_LE(ok.ranks[0].peak_total, *c.memory_per_rank);
}

// At stage 3 the parameter shards are the last states memory holds beside the gradients:
// under a budget only they meet, the refusal names optimizer,params and that run trains.
TEST(OffloadBudget, ABudgetOnlyParameterOffloadMeetsTrainsAndTheRefusalSaysSo) {
  TempDir tmp;
  TrainConfig c = tiny_config(2, 3);
  c.offload_piece = 2048;
  c.offload_dir = tmp.path().string();
  const auto peak = [&](Offload o) {
    TrainConfig r = c;
    r.offload = o;
    return run(r);
  };
  const TrainResult params = peak(Offload::kParams);
  const TrainResult optimizer = peak(Offload::kOptimizer);
  const uint64_t least = params.ranks[0].peak_total, next = optimizer.ranks[0].peak_total;
  ASSERT_LT(least, next);
  c.memory_per_rank = least + (next - least) / 2;
  for (const Offload o : {Offload::kNone, Offload::kOptimizer}) {
    c.offload = o;
    try {
      run(c);
      ADD_FAILURE() << "the budget admitted --offload " << offload_name(o);
    } catch (const OutOfMemory& e) {
      const bool named =
          std::string(e.what()).find("--offload optimizer,params") != std::string::npos;
      // Offered to a run without offload; a run that asked for offload is told what fits.
      EXPECT_EQ(named, o == Offload::kNone) << e.what();
    }
  }
  c.offload = Offload::kParams;
  const TrainResult ok = run(c);
  EXPECT_EQ(ok.weights_sha256, params.weights_sha256);
  EXPECT_EQ(ok.weights_sha256, optimizer.weights_sha256);
  EXPECT_LE(ok.ranks[0].peak_total, *c.memory_per_rank);
}

}  // namespace
}  // namespace zerodp
