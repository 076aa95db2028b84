// Faults are named, not hung: injected failures (--inject) end the run on every rank with
// the rank, the collective and the step named; a non-finite gradient skips the step on every
// rank without touching a weight; a failed checkpoint write commits nothing.
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "checkpoint/consolidate.h"
#include "checkpoint/store.h"
#include "checkpoint_testing.h"
#include "core/error.h"
#include "temp_dir.h"
#include "train/setup.h"
#include "train/stop.h"
#include "train_testing.h"

namespace zerodp {
namespace {

namespace fs = std::filesystem;
using testing::run;
constexpr auto states = testing::checkpoint_states;
using testing::TempDir;
using testing::tiny_config;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `c`, expecting an error of type E; returns its message and how long the run took.
template <typename E>
std::pair<std::string, double> fails(const TrainConfig& c) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)run(c);
  } catch (const E& e) {
    return {e.what(), seconds_since(t0)};
  }
  ADD_FAILURE() << "the run did not fail with the expected error";
  return {"", seconds_since(t0)};
}

TEST(Inject, ParsesItsFormsAndNamesWhatWorks) {
  const Injection a = parse_injection("nan@3:1");
  EXPECT_EQ(a.kind, Injection::Kind::kNan);
  EXPECT_EQ(a.step, 3);
  EXPECT_EQ(a.rank, 1);
  const Injection b = parse_injection("hang@12");
  EXPECT_EQ(b.kind, Injection::Kind::kHang);
  EXPECT_EQ(b.rank, 0);
  for (const char* bad : {"nan", "nan@", "nan@x", "nan@0", "nan@3:", "nan@3:-1", "boom@3", "@3"}) {
    try {
      (void)parse_injection(bad);
      ADD_FAILURE() << bad << " parsed";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("KIND@STEP[:RANK]"), std::string::npos) << e.what();
    }
  }
}

TEST(Faults, AThrowingRankEndsEveryRankNamingItAndTheStep) {
  for (int stage : {0, 3}) {
    TrainConfig c = tiny_config(4, stage);
    c.steps = 5;
    c.inject = {parse_injection("throw@3:2")};
    const auto [what, seconds] = fails<Error>(c);
    EXPECT_NE(what.find("rank 2 of 4, step 3"), std::string::npos) << what;
    EXPECT_NE(what.find("injected failure"), std::string::npos) << what;
    EXPECT_LT(seconds, 5.0) << "stage " << stage;
  }
}

TEST(Faults, AFailedAllocationEndsEveryRankNamingIt) {
  TrainConfig c = tiny_config(3, 3);
  c.steps = 4;
  c.inject = {parse_injection("oom@2:1")};
  // Named as what ran out, with what would help, not as a bare std::bad_alloc.
  const auto [what, seconds] = fails<OutOfMemory>(c);
  EXPECT_NE(what.find("rank 1 of 3, step 2: out of memory: an allocation failed (std::bad_alloc); "
                      "use a higher --stage"),
            std::string::npos)
      << what;
  EXPECT_LT(seconds, 5.0);
}

TEST(Faults, AHungRankIsNamedWithTheCollectiveAtTheTimeout) {
  TrainConfig c = tiny_config(3, 2);
  c.steps = 5;
  c.launch.comm.timeout_seconds = 2;
  c.inject = {parse_injection("hang@2:1")};
  const auto [what, seconds] = fails<CommError>(c);
  EXPECT_NE(what.find("step 2"), std::string::npos) << what;
  EXPECT_NE(what.find("timed out after 2 s"), std::string::npos) << what;
  EXPECT_NE(what.find("waiting for rank(s) 1"), std::string::npos) << what;
  EXPECT_NE(what.find("#"), std::string::npos) << "no sequence number: " << what;
  // Told by a rank that waited, not as if the late rank had failed of itself.
  EXPECT_EQ(what.find("rank 1 failed"), std::string::npos) << what;
  EXPECT_EQ(what.rfind("rank 1 of 3", 0), std::string::npos) << what;
  // The hung rank sleeps one second past the timeout before it notices.
  EXPECT_GE(seconds, 2.0);
  EXPECT_LT(seconds, 6.0);
}

class NonFinite : public ::testing::TestWithParam<std::tuple<int, Precision>> {};

TEST_P(NonFinite, SkipsTheStepOnEveryRankAndLeavesEveryStateAlone) {
  const auto [stage, precision] = GetParam();
  TempDir tmp;
  TrainConfig c = tiny_config(3, stage, precision);
  c.steps = 5;
  c.checkpoint_dir = tmp.path().string();
  c.checkpoint_every = 1;
  c.inject = {parse_injection("nan@3:2")};
  const TrainResult r = run(c);
  ASSERT_EQ(r.steps.size(), 5u);
  EXPECT_TRUE(r.steps[2].skipped);
  EXPECT_EQ(r.steps[2].bad_rank, 2);
  EXPECT_EQ(r.steps[2].bad_unit, "head");
  EXPECT_FALSE(r.steps[3].skipped) << "one bad value must not poison the next step";
  EXPECT_TRUE(std::isfinite(r.steps[4].loss));
  const checkpoint::Checkpoint before(tmp.path() / "step_00000002");
  const checkpoint::Checkpoint after(tmp.path() / "step_00000003");
  EXPECT_EQ(before.meta().adam_step, after.meta().adam_step);
  EXPECT_EQ(states(tmp.path() / "step_00000002"), states(tmp.path() / "step_00000003"));
  EXPECT_NE(states(tmp.path() / "step_00000003"), states(tmp.path() / "step_00000004"));
}

INSTANTIATE_TEST_SUITE_P(StagesAndPrecisions, NonFinite,
                         ::testing::Values(std::tuple{0, Precision::kBF16},
                                           std::tuple{1, Precision::kFP32},
                                           std::tuple{2, Precision::kBF16},
                                           std::tuple{3, Precision::kFP32},
                                           std::tuple{3, Precision::kFP16}));

TEST(NonFinite, MaxSkipsStopsNamingTheFirstUnitAndRank) {
  TrainConfig c = tiny_config(2, 1, Precision::kFP32);
  c.steps = 8;
  c.max_skips = 2;
  c.inject = {parse_injection("nan@3:1"), parse_injection("nan@4:0")};
  // A stop, not a failure: the run returns what it did, so its report can still be written.
  const TrainResult r = run(c);
  ASSERT_TRUE(r.stopped.has_value());
  EXPECT_EQ(r.stopped->reason, EarlyStop::Reason::kMaxSkips);
  EXPECT_EQ(r.stopped->after_step, 4);
  EXPECT_EQ(r.steps.size(), 4u);
  const std::string& what = r.stopped->message;
  EXPECT_NE(what.find("2 consecutive steps skipped"), std::string::npos) << what;
  EXPECT_NE(what.find("step 3, had one in unit head on rank 1"), std::string::npos) << what;
  EXPECT_EQ(what.rfind("step 4: ", 0), 0u) << "led by the stop's own step: " << what;
}

// A stop request that reaches one rank only (as a signal under MPI does) stops every rank
// after the same step, with a checkpoint there; the continuation is the run that never
// stopped, bit for bit.
TEST(Stop, ARequestOnOneRankStopsEveryRankAfterTheSameStepAndSaves) {
  for (const int stage : {0, 3}) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    TempDir tmp;
    TrainConfig whole = tiny_config(3, stage);
    whole.steps = 7;
    const TrainResult reference = run(whole);
    ASSERT_FALSE(reference.stopped.has_value());

    TrainConfig c = whole;
    c.checkpoint_dir = tmp.path().string();
    c.inject = {parse_injection("term@3:2")};
    const TrainResult r = run(c);
    clear_stop_request();
    ASSERT_TRUE(r.stopped.has_value());
    EXPECT_EQ(r.stopped->reason, EarlyStop::Reason::kSignal);
    EXPECT_EQ(r.stopped->signal, SIGTERM);
    EXPECT_EQ(r.stopped->after_step, 3);
    ASSERT_EQ(r.steps.size(), 3u);
    EXPECT_EQ(r.steps[2].stop_signal, SIGTERM);
    EXPECT_EQ(r.steps[2].checkpoint, (tmp.path() / "step_00000003").string());
    EXPECT_FALSE(r.val_loss.has_value()) << "an interrupted run skips the final evaluation";
    EXPECT_EQ(checkpoint::find_latest(tmp.path())->filename(), "step_00000003");

    TrainConfig rest = whole;
    rest.checkpoint_dir = tmp.path().string();
    rest.resume = "latest";
    const TrainResult continued = run(rest);
    EXPECT_EQ(continued.weights_sha256, reference.weights_sha256);
    EXPECT_EQ(continued.steps.back().loss, reference.steps.back().loss);
  }
}

TEST(Stop, ARequestBeforeTheFirstStepTrainsNothing) {
  request_stop(SIGINT);
  TrainConfig c = tiny_config(2, 1);
  c.steps = 3;
  try {
    (void)run(c);
    ADD_FAILURE() << "the run trained";
  } catch (const Interrupted& e) {
    EXPECT_EQ(e.signal(), SIGINT);
    EXPECT_NE(std::string(e.what()).find("interrupted by SIGINT before the first step"),
              std::string::npos)
        << e.what();
  }
  clear_stop_request();
}

TEST(Stop, TheFirstRequestWins) {
  request_stop(SIGTERM);
  request_stop(SIGINT);
  EXPECT_EQ(stop_requested(), SIGTERM);
  clear_stop_request();
  EXPECT_EQ(stop_requested(), 0);
}

TEST(NonFinite, SkipsApartDoNotAddUp) {
  TrainConfig c = tiny_config(2, 2, Precision::kBF16);
  c.steps = 6;
  c.max_skips = 2;
  c.inject = {parse_injection("nan@2:1"), parse_injection("nan@4:0")};
  const TrainResult r = run(c);
  EXPECT_TRUE(r.steps[1].skipped && r.steps[3].skipped);
}

// Every rank agrees the save failed, so they stop together there, like a stop request: the
// run's result (and its report) says what was trained and why it ended, and the temporary
// is gone (on a full disk its space is what the user needs back).
TEST(Faults, AFailedCheckpointWriteCommitsNothingStopsTheRunAndNamesTheRank) {
  TempDir tmp;
  TrainConfig c = tiny_config(3, 3);
  c.steps = 6;
  c.checkpoint_dir = tmp.path().string();
  c.checkpoint_every = 2;
  c.inject = {parse_injection("io@4:1")};
  const TrainResult r = run(c);
  ASSERT_TRUE(r.stopped.has_value());
  EXPECT_EQ(r.stopped->reason, EarlyStop::Reason::kCheckpointFailed);
  EXPECT_EQ(r.stopped->after_step, 4);
  EXPECT_EQ(r.steps.size(), 4u);
  EXPECT_NE(r.stopped->message.find("step 4"), std::string::npos) << r.stopped->message;
  EXPECT_NE(r.stopped->message.find("rank(s) 1 could not write"), std::string::npos)
      << r.stopped->message;
  EXPECT_EQ(checkpoint::find_latest(tmp.path())->filename(), "step_00000002");
  EXPECT_FALSE(fs::exists(tmp.path() / "step_00000004"));
  EXPECT_FALSE(fs::exists(tmp.path() / ".tmp.step_00000004"));
}

TEST(Preflight, ARunPastTheMachinesMemoryIsRefusedBeforeAllocating) {
  TrainConfig c = tiny_config(8, 0);
  c.size = "large";  // GPT-2 small's shape; 8 ranks x 120 sequences of 1024 tokens
  c.micro_batch = 120;
  c.steps = 1;
  const auto [what, seconds] = fails<OutOfMemory>(c);
  EXPECT_NE(what.find("available"), std::string::npos) << what;
  EXPECT_NE(what.find("--checkpoint-activations"), std::string::npos) << what;
  EXPECT_LT(seconds, 10.0) << "refused only after allocating";
}

TEST(Preflight, ABudgetTheRankCannotFitIsRefusedNamingWhatWould) {
  TrainConfig c = tiny_config(4, 0);
  c.memory_per_rank = 1 << 20;  // 1 MiB: stage 0's states alone are ~670 KiB, plus activations
  const auto [what, seconds] = fails<OutOfMemory>(c);
  EXPECT_NE(what.find("rank 0 would need"), std::string::npos) << what;
  EXPECT_NE(what.find("stage 3"), std::string::npos) << what;
}

TEST(Faults, AnInjectionAtARankTheRunLacksIsRefused) {
  TrainConfig c = tiny_config(2, 0);
  c.inject = {parse_injection("throw@1:2")};
  EXPECT_THROW((void)run(c), InvalidArgument);
}

// --init-from is checked, hashed and read in one sequence of bytes: a file rewritten in place
// once the check is done (here when the first rank thread builds its model, on the local
// backend) is refused at the ranks' read, whether it now holds a NaN or a finite value the
// hash never saw.
TEST(InitFrom, AFileRewrittenAfterItsCheckIsRefusedNotTrainedOn) {
  TempDir tmp;
  TrainConfig src = tiny_config(2, 1);
  src.steps = 1;
  src.checkpoint_dir = (tmp.path() / "src").string();
  (void)run(src);
  const fs::path weights = tmp.path() / "w.safetensors";
  for (const float value : {std::nanf(""), 0.5f}) {
    (void)checkpoint::export_fp32(src.checkpoint_dir, weights);
    TrainConfig c = tiny_config(2, 1);
    c.init_from = weights.string();
    TrainConfig resolved = c;
    resolve_config(resolved);
    const std::thread::id checker = std::this_thread::get_id();
    std::once_flag rewrite;
    const ModelFactory make = [&]() {
      if (std::this_thread::get_id() != checker) {
        std::call_once(rewrite, [&]() {
          std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
          uint64_t header = 0;
          f.read(reinterpret_cast<char*>(&header), sizeof header);
          f.seekp(static_cast<std::streamoff>(8 + header));
          f.write(reinterpret_cast<const char*>(&value), sizeof value);
        });
      }
      return build_model(resolved);
    };
    int argc = 1;
    char name[] = "test";
    char* args[] = {name, nullptr};
    char** argv = args;
    try {
      (void)train(c, argc, argv, {}, make);
      ADD_FAILURE() << "trained on a file rewritten after its check (value " << value << ")";
    } catch (const CorruptData& e) {
      EXPECT_NE(std::string(e.what()).find("the file changed while it was read"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace zerodp
