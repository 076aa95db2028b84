// --checkpoint-async (train/async_save.h): the files of a synchronous save, commits only of
// durable saves, failures named at a later step with the previous checkpoint kept, the skip
// policy, --keep, and the staging memory in the ledger.
#include <gtest/gtest.h>

#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/store.h"
#include "core/stop_flag.h"
#include "temp_dir.h"
#include "train/plan.h"
#include "train/report.h"
#include "train_testing.h"

namespace zerodp {
namespace {

namespace fs = std::filesystem;
using testing::file_bytes;
using testing::run;
using testing::TempDir;
using testing::tiny_config;

// meta.json without the run's options (which name the directory and --checkpoint-async).
nlohmann::json meta_without_config(const fs::path& dir) {
  nlohmann::json j = nlohmann::json::parse(file_bytes(dir / "meta.json"));
  j.erase("config");
  return j;
}

// Every committed step of `a` and `b` holds the same files, byte for byte.
void expect_same_checkpoints(const fs::path& a, const fs::path& b, const std::string& what) {
  const std::vector<fs::path> steps = checkpoint::list_checkpoints(a);
  ASSERT_EQ(steps.size(), checkpoint::list_checkpoints(b).size()) << what;
  ASSERT_FALSE(steps.empty()) << what;
  for (const fs::path& step : steps) {
    const fs::path other = b / step.filename();
    for (const auto& entry : fs::directory_iterator(step)) {
      const std::string name = entry.path().filename().string();
      if (name == "meta.json") {
        EXPECT_EQ(meta_without_config(step), meta_without_config(other)) << what << " " << step;
      } else {
        EXPECT_EQ(file_bytes(entry.path()), file_bytes(other / name))
            << what << " " << step.filename() << "/" << name;
      }
    }
  }
}

// `c` saving into `dir` every `every` steps, in the background.
TrainConfig saving_async(TrainConfig c, const fs::path& dir, int64_t every) {
  c.checkpoint_dir = dir.string();
  c.checkpoint_every = every;
  c.checkpoint_async = true;
  return c;
}

// Nothing temporary is left in `dir`: every save was committed or removed.
void expect_no_temporaries(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp", 0), 0u) << e.path();
  }
}

struct Case {
  std::string name;
  TrainConfig config;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  TrainConfig c = tiny_config(2, 1);
  c.steps = 5;
  out.push_back({"stage 1 bf16", c});
  c = tiny_config(3, 3, Precision::kFP32);
  c.steps = 4;
  out.push_back({"stage 3 fp32, 3 ranks", c});
  // HSDP: node 1's ranks hold copies and write nothing.
  c = tiny_config(4, 2);
  c.steps = 4;
  c.launch.comm.node_ranks = 2;
  c.shard_within_node = true;
  out.push_back({"HSDP", c});
  // Streaming DiLoCo: exchanges in flight at some boundaries (sent after 2 and 4, merged a
  // step later), saved with the outer state.
  c = tiny_config(4, 1);
  c.micro_batch = 2;
  c.grad_accum = 2;
  c.accumulate = AccumulatePolicy::kReduce;
  c.islands = 2;
  c.outer_every = 4;
  c.fragments = 2;
  c.outer_delay = 1;
  c.steps = 7;
  out.push_back({"streaming islands", c});
  // The same islands in turn on 2 ranks: every island's shard staged and written (the
  // files of ranks v N + r), 8-bit moments too.
  TrainConfig turn = c;
  turn.islands_in_turn = true;
  turn.launch.ranks = 2;
  turn.int8_moments = true;
  out.push_back({"streaming islands in turn, int8 moments", turn});
  // Islands without a delay: the outer state, no exchange in flight at any boundary; 8-bit
  // moments at fp32, no master beside the codes.
  TrainConfig still = tiny_config(4, 2, Precision::kFP32);
  still.islands = 2;
  still.outer_every = 2;
  still.int8_moments = true;
  still.steps = 4;
  out.push_back({"islands without a delay, fp32, int8 moments, stage 2", still});
  // Offloaded islands: the outer state from memory beside the file, the exchange staged.
  c.offload = Offload::kOptimizer;
  c.offload_piece = 2048;
  out.push_back({"streaming islands, offload optimizer", c});
  // 8-bit moments: codes, scales and fp32 parts (train/moments_io.h).
  c = tiny_config(3, 2);
  c.steps = 4;
  c.int8_moments = true;
  out.push_back({"int8 moments, stage 2, 3 ranks", c});
  // Offloaded: read from the file as the next update waits, not staged.
  c = tiny_config(2, 1);
  c.steps = 4;
  c.offload = Offload::kOptimizer;
  out.push_back({"offload optimizer, stage 1 bf16", c});
  // The codes from the file, the scales and fp32 parts from memory.
  c.int8_moments = true;
  out.push_back({"offload optimizer, int8 moments, stage 1 bf16", c});
  c = tiny_config(3, 3, Precision::kFP32);
  c.steps = 4;
  c.offload = Offload::kParams;
  out.push_back({"offload optimizer,params, stage 3 fp32", c});
  c = tiny_config(2, 0);
  c.steps = 4;
  c.offload = Offload::kOptimizer;
  c.offload_overlap = true;
  out.push_back({"offload optimizer, stage 0, overlapped update", c});
  return out;
}

TEST(AsyncSave, WritesTheBytesOfASynchronousSave) {
  for (Case& k : cases()) {
    TempDir tmp;
    TrainConfig sync = k.config;
    sync.checkpoint_every = 1;
    sync.checkpoint_dir = (tmp.path() / "sync").string();
    if (sync.offload != Offload::kNone) sync.offload_dir = tmp.path().string();
    TrainConfig async = sync;
    async.checkpoint_dir = (tmp.path() / "async").string();
    async.checkpoint_async = true;
    const TrainResult a = run(async);
    const TrainResult s = run(sync);
    EXPECT_EQ(a.weights_sha256, s.weights_sha256) << k.name;
    expect_same_checkpoints(sync.checkpoint_dir, async.checkpoint_dir, k.name);
    // Every save waited for the last, so every step committed one.
    EXPECT_EQ(a.saves.requested, k.config.steps) << k.name;
    EXPECT_EQ(a.saves.committed, k.config.steps) << k.name;
    EXPECT_EQ(a.saves.skipped, 0) << k.name;
    // The writer's times: every save but the run's last, written synchronously.
    EXPECT_EQ(a.saves.write_seconds.size(), static_cast<size_t>(k.config.steps - 1)) << k.name;
    // And its CPU time in them: some, and no more than the time they took (one thread).
    ASSERT_EQ(a.saves.write_cpu_seconds.size(), a.saves.write_seconds.size()) << k.name;
    for (size_t i = 0; i < a.saves.write_seconds.size(); ++i) {
      EXPECT_GT(a.saves.write_cpu_seconds[i], 0) << k.name << " save " << i;
      EXPECT_LE(a.saves.write_cpu_seconds[i], a.saves.write_seconds[i] + 1e-3)
          << k.name << " save " << i;
    }
    // The staging every rank allocated is the planner's (preflight, report, estimate).
    const auto staging = static_cast<size_t>(MemCategory::kCheckpointStaging);
    const nlohmann::json plan = report_json(a)["plan"]["model_state_bytes"];
    for (int rank = 0; rank < a.world_size; ++rank) {
      const uint64_t planned =
          checkpoint_staging_bytes(a.unit_numel, async, a.world_size, rank, &a.unit_tensors);
      EXPECT_EQ(a.ranks[static_cast<size_t>(rank)].peak[staging], planned)
          << k.name << " rank " << rank;
      EXPECT_EQ(plan[static_cast<size_t>(rank)]["checkpoint_staging"], planned) << k.name;
    }
  }
}

// Offloaded states are read from the file while training goes on: with the writer held up
// 2 s before it reads, the next update waits for it before rewriting a unit, so the files
// are still the step's (a synchronous save's bytes) and the wait is in the save's stall;
// with 8-bit moments also for the scales the update rewrites in memory.
TEST(AsyncSave, AnOffloadedUpdateWaitsForTheWriterToReadTheOldValues) {
  for (const bool int8 : {false, true}) {
    TempDir tmp;
    TrainConfig sync = tiny_config(2, 3);
    sync.steps = 4;
    sync.int8_moments = int8;
    sync.offload = Offload::kOptimizer;
    sync.offload_dir = tmp.path().string();
    sync.checkpoint_every = 1;
    sync.checkpoint_dir = (tmp.path() / "sync").string();
    TrainConfig async = sync;
    async.checkpoint_dir = (tmp.path() / "async").string();
    async.checkpoint_async = true;
    async.inject = {parse_injection("slowio@2:1")};
    const TrainResult a = run(async);
    (void)run(sync);
    const std::string name = int8 ? "slow offloaded write, int8" : "slow offloaded write";
    expect_same_checkpoints(sync.checkpoint_dir, async.checkpoint_dir, name);
    ASSERT_EQ(a.saves.stall_seconds.size(), 4u) << name;
    EXPECT_GT(a.saves.stall_seconds[1], 1.0) << name << ": step 3's update waited for step 2's";
  }
}

// A continuation from an asynchronous checkpoint is the uninterrupted run.
TEST(AsyncSave, AResumeContinuesTheUninterruptedRun) {
  TempDir tmp;
  TrainConfig c = tiny_config(2, 3);
  c.steps = 6;
  const TrainResult whole = run(c);
  c = saving_async(c, tmp.path(), 1);
  c.stop_after = 4;
  (void)run(c);
  EXPECT_EQ(checkpoint::find_latest(tmp.path())->filename(), "step_00000004");
  c.stop_after = 0;
  c.resume = "latest";
  EXPECT_EQ(run(c).weights_sha256, whole.weights_sha256);
}

// A write that fails in the background is named at the boundary that finds it; the run
// stops as after a failed synchronous save, and the previous checkpoint stays `latest`.
// Every rank names the file and the cause, whichever rank's message the run reports (the
// rank that met it is one of three); a synchronous save's too.
TEST(AsyncSave, AFailedBackgroundWriteIsNamedAndKeepsThePreviousCheckpoint) {
  for (bool async : {true, false}) {
    TempDir tmp;
    TrainConfig c = tiny_config(3, 2);
    c.steps = 8;
    c = saving_async(c, tmp.path(), 2);
    c.checkpoint_async = async;
    c.inject = {parse_injection("io@4:1")};
    const TrainResult r = run(c);
    ASSERT_TRUE(r.stopped.has_value()) << "async " << async;
    EXPECT_EQ(r.stopped->reason, EarlyStop::Reason::kCheckpointFailed);
    // Found at a boundary after step 4 (at the latest at 6, where the next save waits for it).
    EXPECT_GE(r.stopped->after_step, async ? 5 : 4);
    EXPECT_LE(r.stopped->after_step, async ? 6 : 4);
    const std::string& m = r.stopped->message;
    EXPECT_NE(m.find("checkpoint at step 4 not committed: rank(s) 1 could not write their "
                     "files: cannot write "),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("rank_00001.safetensors: injected failure (--inject io@4:1)"),
              std::string::npos)
        << m;
    EXPECT_EQ(checkpoint::find_latest(tmp.path())->filename(), "step_00000002");
    EXPECT_FALSE(fs::exists(tmp.path() / "step_00000004"));
    EXPECT_FALSE(fs::exists(tmp.path() / ".tmp.step_00000004"));
    EXPECT_EQ(r.saves.committed, 1);
  }
}

// The commit runs on rank 0's writer, after every rank's files are agreed: its failure is
// named at a later boundary, every rank stops, and latest stays at the last committed save.
// Synchronous saves commit on the training thread and fail at the step itself.
TEST(AsyncSave, AFailedCommitIsNamedAndKeepsThePreviousCheckpoint) {
  for (bool async : {true, false}) {
    TempDir tmp;
    TrainConfig c = tiny_config(3, 2);
    c.steps = 8;
    c = saving_async(c, tmp.path(), 2);
    c.checkpoint_async = async;
    c.inject = {parse_injection("commitio@4")};
    const TrainResult r = run(c);
    ASSERT_TRUE(r.stopped.has_value()) << "async " << async;
    EXPECT_EQ(r.stopped->reason, EarlyStop::Reason::kCheckpointFailed);
    if (async) {
      // Agreed at a boundary after its write (at the latest step 6's, where the save due
      // waits for the staging), its commit handed to the writer, which runs it before step
      // 6's write: the verdict is found at a later boundary, at the latest the one that finds
      // that write done, or the run's end (step 8).
      EXPECT_GE(r.stopped->after_step, 5);
      EXPECT_LE(r.stopped->after_step, 8);
    } else {
      EXPECT_EQ(r.stopped->after_step, 4);
    }
    // Every rank names rank 0's error, whichever rank's message the run reports.
    const std::string& m = r.stopped->message;
    EXPECT_NE(m.find("checkpoint at step 4 not committed: cannot commit into"), std::string::npos)
        << m;
    EXPECT_EQ(checkpoint::find_latest(tmp.path())->filename(), "step_00000002");
    EXPECT_FALSE(fs::exists(tmp.path() / "step_00000004"));
    EXPECT_EQ(r.saves.committed, 1);
  }
}

// A due save's copy does not wait for the commit of the save before: the writer runs that
// commit ahead of the new save's write. With step 2's commit 2 s slow, step 3's copy begins
// before that commit ends; the wait comes where step 3's write is needed, and every save is
// committed.
TEST(AsyncSave, ADueSaveIsCopiedWhileTheSaveBeforeCommits) {
  TempDir tmp;
  TrainConfig c = saving_async(tiny_config(2, 1), tmp.path() / "ck", 1);
  c.steps = 5;
  c.inject = {parse_injection("slowcommit@2")};
  c.trace_path = (tmp.path() / "trace.json").string();
  const TrainResult r = run(c);
  ASSERT_FALSE(r.stopped.has_value()) << r.stopped->message;
  EXPECT_EQ(r.saves.committed, 5);
  std::ifstream in(c.trace_path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::vector<int64_t> copies;  // rank 0's, the starts in order: steps 1..4 (5's is synchronous)
  int64_t commit_end = -1;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["pid"] != 0) continue;
    const auto name = e["name"].get<std::string>();
    const auto ts = e["ts"].get<int64_t>();
    if (name == "checkpoint copy") copies.push_back(ts);
    if (name == "checkpoint commit, step 2") commit_end = ts + e["dur"].get<int64_t>();
  }
  std::sort(copies.begin(), copies.end());
  ASSERT_EQ(copies.size(), 4u);
  ASSERT_GT(commit_end, 0) << "no span of step 2's commit";
  EXPECT_LT(copies[2], commit_end) << "step 3's copy waited for step 2's commit";
  ASSERT_EQ(r.saves.stall_seconds.size(), 5u);
  EXPECT_LT(r.saves.stall_seconds[1], 1.0) << "step 2's save";
  EXPECT_GT(r.saves.stall_seconds[2], 1.0) << "step 3's save: its write waited for the commit";
}

// A slow write (2 s) keeps the save of step 1 in flight: under --checkpoint-busy skip the
// saves due meanwhile are skipped and counted; under wait every one is committed.
TEST(AsyncSave, ASaveDueWhileOneIsInFlightIsSkippedOrWaitsAsTheUserChose) {
  for (bool skip : {true, false}) {
    TempDir tmp;
    TrainConfig c = tiny_config(2, 1);
    c.steps = 6;
    c = saving_async(c, tmp.path(), 1);
    c.checkpoint_skip_busy = skip;
    c.inject = {parse_injection("slowio@1:0")};
    const TrainResult r = run(c);
    ASSERT_FALSE(r.stopped.has_value());
    EXPECT_EQ(r.saves.requested, 6);
    EXPECT_EQ(r.saves.requested, r.saves.committed + r.saves.skipped);
    EXPECT_EQ(checkpoint::find_latest(tmp.path())->filename(), "step_00000006");
    EXPECT_TRUE(fs::exists(tmp.path() / "step_00000001"));
    if (skip) {
      // Steps 2-5 take far less than 2 s: their saves find step 1's still writing.
      EXPECT_GE(r.saves.skipped, 3) << "skipped " << r.saves.skipped;
      EXPECT_FALSE(fs::exists(tmp.path() / "step_00000002"));
    } else {
      EXPECT_EQ(r.saves.skipped, 0);
      EXPECT_EQ(checkpoint::list_checkpoints(tmp.path()).size(), 6u);
    }
    const nlohmann::json j = report_json(r)["checkpoints"];
    EXPECT_EQ(j["async"], true);
    EXPECT_EQ(j["skipped"], r.saves.skipped);
    EXPECT_EQ(j["committed"], r.saves.committed);
  }
}

// A signal while a save is in flight: a write that ends within --checkpoint-signal-wait is
// committed and the interrupted step saved after it; one that does not (a 2 s write, a 0.3 s
// bound) is abandoned within the bound, its temporary removed, latest left where it was.
TEST(AsyncSave, ASignalFinishesTheSaveInFlightOrAbandonsItWithinTheBound) {
  for (const double bound : {0.3, 10.0}) {
    SCOPED_TRACE(fmt::format("--checkpoint-signal-wait {}", bound));
    TempDir tmp;
    TrainConfig c = tiny_config(2, 2);
    c.steps = 8;
    c = saving_async(c, tmp.path(), 2);
    c.checkpoint_signal_wait = bound;
    c.inject = {parse_injection("slowio@4:1"), parse_injection("term@5:0")};
    const TrainResult r = run(c);
    clear_stop_request();
    ASSERT_TRUE(r.stopped.has_value());
    EXPECT_EQ(r.stopped->reason, EarlyStop::Reason::kSignal);
    EXPECT_EQ(r.stopped->after_step, 5);
    expect_no_temporaries(tmp.path());
    const nlohmann::json j = report_json(r)["checkpoints"];
    ASSERT_FALSE(r.saves.stall_seconds.empty());
    if (bound < 1) {
      EXPECT_EQ(r.saves.abandoned, 4);
      EXPECT_EQ(j["abandoned"], 4);
      EXPECT_EQ(checkpoint::find_latest(tmp.path())->filename(), "step_00000002");
      EXPECT_FALSE(fs::exists(tmp.path() / "step_00000005"));
      // Well inside the injected 2 s: the writer stopped waiting when abandoned.
      EXPECT_LT(r.saves.stall_seconds.back(), 1.5);
      EXPECT_EQ(r.saves.requested, r.saves.committed + 1);
    } else {
      EXPECT_FALSE(r.saves.abandoned.has_value());
      EXPECT_TRUE(j["abandoned"].is_null());
      EXPECT_TRUE(fs::exists(tmp.path() / "step_00000004"));
      EXPECT_EQ(checkpoint::find_latest(tmp.path())->filename(), "step_00000005");
      EXPECT_EQ(r.steps.back().checkpoint, (tmp.path() / "step_00000005").string());
    }
  }
}

// --keep prunes committed checkpoints only: the save in flight is a temporary, never
// counted or removed.
TEST(AsyncSave, KeepPrunesOnlyCommittedCheckpoints) {
  TempDir tmp;
  TrainConfig c = tiny_config(2, 0);
  c.steps = 7;
  c = saving_async(c, tmp.path(), 1);
  c.keep = 2;
  (void)run(c);
  std::vector<std::string> names;
  for (const fs::path& p : checkpoint::list_checkpoints(tmp.path())) {
    names.push_back(p.filename().string());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"step_00000006", "step_00000007"}));
  expect_no_temporaries(tmp.path());
}

// The staging buffer is the shard's tensors: the file's size less its header, in the ledger.
TEST(AsyncSave, StagingIsTheShardsBytesInTheLedger) {
  TempDir tmp;
  TrainConfig c = saving_async(tiny_config(2, 3), tmp.path(), 1);
  const TrainResult r = run(c);
  const fs::path shard = tmp.path() / "step_00000003" / "rank_00001.safetensors";
  const std::string bytes = file_bytes(shard);
  ASSERT_GT(bytes.size(), 8u);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(bytes[i]);
  const auto staging = static_cast<int>(MemCategory::kCheckpointStaging);
  // The shard's tensor bytes, and the room to place them where the file's blocks fall.
  EXPECT_EQ(r.ranks[1].peak[staging], bytes.size() - 8 - header + kStagingShardSlack);
  // A synchronous run stages nothing.
  c.checkpoint_async = false;
  c.checkpoint_dir = (tmp.path() / "sync").string();
  EXPECT_EQ(run(c).ranks[1].peak[staging], 0u);
}

}  // namespace
}  // namespace zerodp
