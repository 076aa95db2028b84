// Checkpoints through the engine: a continuation is the run that never stopped, bit for
// bit; any (N, stage) loads any other; the commit protocol keeps what it promises; and a
// damaged checkpoint is refused before any state changes.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/consolidate.h"
#include "checkpoint/store.h"
#include "checkpoint_testing.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "core/sha256.h"
#include "temp_dir.h"
#include "train/report.h"
#include "train_testing.h"

namespace zerodp {
namespace {

namespace fs = std::filesystem;
using testing::run;
constexpr auto states = testing::checkpoint_states;
using testing::TempDir;
using testing::tiny_config;

std::vector<double> losses(const TrainResult& r) {
  std::vector<double> v;
  for (const auto& s : r.steps) v.push_back(s.loss);
  return v;
}

std::vector<double> tail(const std::vector<double>& v, size_t from) {
  return {v.begin() + static_cast<std::ptrdiff_t>(from), v.end()};
}

struct ResumeCase {
  int ranks;
  int stage;
  Precision precision;
  int grad_accum;
};

void PrintTo(const ResumeCase& c, std::ostream* os) {
  *os << fmt::format("N={} stage {} {} A={}", c.ranks, c.stage, precision_name(c.precision),
                     c.grad_accum);
}

class Resume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(Resume, ContinuationIsTheRunThatNeverStopped) {
  const ResumeCase p = GetParam();
  TempDir tmp;
  TrainConfig c = tiny_config(p.ranks, p.stage, p.precision);
  c.grad_accum = p.grad_accum;
  c.steps = 7;
  c.checkpoint_dir = (tmp.path() / "full").string();
  c.checkpoint_every = 3;
  const TrainResult full = run(c);
  ASSERT_EQ(full.steps.size(), 7u);
  EXPECT_TRUE(fs::exists(tmp.path() / "full" / "step_00000003" / "meta.json"));
  EXPECT_TRUE(fs::exists(tmp.path() / "full" / "step_00000006" / "meta.json"));
  EXPECT_TRUE(fs::exists(tmp.path() / "full" / "step_00000007" / "meta.json"));

  for (int at : {3, 6}) {
    TrainConfig r = c;
    r.checkpoint_dir = (tmp.path() / fmt::format("cont{}", at)).string();
    r.resume =
        (tmp.path() / "full" / checkpoint::step_dir_name(static_cast<uint64_t>(at))).string();
    const TrainResult cont = run(r);
    ASSERT_EQ(cont.steps.size(), static_cast<size_t>(7 - at));
    EXPECT_EQ(cont.first_step, at + 1);
    EXPECT_EQ(losses(cont), tail(losses(full), static_cast<size_t>(at))) << "resumed at " << at;
    EXPECT_EQ(cont.weights_sha256, full.weights_sha256) << "resumed at " << at;
    // The samples read, chained through the checkpoint: the same as the run that never stopped.
    EXPECT_EQ(cont.samples_chain, full.samples_chain) << "resumed at " << at;
    EXPECT_EQ(cont.samples_chain_from, 0u);
    // The continuation's own last checkpoint is the never-stopped run's, byte for byte.
    EXPECT_EQ(states(tmp.path() / fmt::format("cont{}", at)), states(tmp.path() / "full"));
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, Resume,
                         ::testing::Values(ResumeCase{1, 0, Precision::kBF16, 1},
                                           ResumeCase{2, 0, Precision::kFP32, 1},
                                           ResumeCase{2, 1, Precision::kBF16, 2},
                                           ResumeCase{3, 2, Precision::kFP16, 1},
                                           ResumeCase{2, 3, Precision::kBF16, 1},
                                           ResumeCase{4, 3, Precision::kFP32, 2}));

TEST(ResumeAt, AStopAfterTimeSliceContinuesAsTheFullRun) {
  TempDir tmp;
  TrainConfig c = tiny_config(2, 3);
  c.steps = 6;
  const TrainResult full = run(c);
  c.checkpoint_dir = tmp.path().string();
  c.stop_after = 4;
  const TrainResult part = run(c);
  ASSERT_EQ(part.steps.size(), 4u);
  EXPECT_EQ(checkpoint::find_latest(tmp.path())->filename(), "step_00000004");
  c.stop_after = 0;
  c.resume = "latest";
  const TrainResult rest = run(c);
  EXPECT_EQ(losses(rest), tail(losses(full), 4));
  EXPECT_EQ(rest.weights_sha256, full.weights_sha256);
}

// The chain of every step's samples says which samples were read, in which order, and
// nothing else: the same for any split of the same K samples per step over ranks and
// micro-batches, resumed or not; another data order changes it.
TEST(SamplesChain, TheSameSamplesGiveTheSameChainOnAnyRanksAndAcrossAResume) {
  TempDir tmp;
  TrainConfig one = tiny_config(1, 0);
  one.steps = 6;
  one.grad_accum = 4;
  const TrainResult a = run(one);
  ASSERT_EQ(a.samples_chain.size(), 64u);
  TrainConfig four = tiny_config(4, 3);
  four.steps = 6;
  four.checkpoint_dir = tmp.path().string();
  four.stop_after = 2;
  run(four);
  TrainConfig two = tiny_config(2, 1);
  two.steps = 6;
  two.grad_accum = 2;
  two.resume = (tmp.path() / "step_00000002").string();
  const TrainResult b = run(two);
  EXPECT_EQ(b.first_step, 3);
  EXPECT_EQ(b.samples_chain, a.samples_chain);
  TrainConfig other = one;
  other.seed += 1;
  EXPECT_NE(run(other).samples_chain, a.samples_chain);
  TrainConfig shorter = one;
  shorter.steps = 5;
  EXPECT_NE(run(shorter).samples_chain, a.samples_chain);
}

// --- the loss history ---------------------------------------------------------------

// What a checkpoint's history keeps of a step: everything but timings and paths.
std::vector<std::string> history_fields(const std::vector<StepRecord>& steps) {
  std::vector<std::string> v;
  for (const auto& s : steps) {
    v.push_back(fmt::format("{} {} {} {} {} {} {} {} {}", s.step, s.loss, s.lr, s.grad_norm,
                            s.grad_norm_clipped, s.loss_scale.value_or(-1), s.skipped, s.tokens,
                            s.val_loss.value_or(-1)));
  }
  return v;
}

std::vector<StepRecord> joined(const TrainResult& r) {
  std::vector<StepRecord> v = r.history;
  v.insert(v.end(), r.steps.begin(), r.steps.end());
  return v;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(History, AContinuationReportsEveryStepOfTheRunThatNeverStopped) {
  TempDir tmp;
  TrainConfig c = tiny_config(2, 1, Precision::kFP16);  // fp16: the loss scale is kept too
  c.steps = 6;
  c.eval_every = 2;
  c.checkpoint_dir = (tmp.path() / "full").string();
  c.checkpoint_every = 3;
  const TrainResult full = run(c);
  EXPECT_TRUE(full.history.empty());
  TrainConfig r = c;
  r.checkpoint_dir = (tmp.path() / "cont").string();
  r.resume = (tmp.path() / "full" / "step_00000003").string();
  const TrainResult cont = run(r);
  ASSERT_EQ(cont.steps.size(), 3u);  // this run's steps alone, as the summary counts them
  EXPECT_EQ(cont.first_step, 4);
  ASSERT_EQ(cont.history.size(), 3u);
  EXPECT_EQ(history_fields(joined(cont)), history_fields(full.steps));
  for (const auto& h : cont.history) {
    EXPECT_EQ(h.seconds, 0);
    EXPECT_FALSE(h.mfu.has_value());
  }
  // Timings never reach a checkpoint: the continuation's history file is the full run's.
  const fs::path tail = fs::path("step_00000006") / checkpoint::kHistoryFile;
  EXPECT_EQ(read_all(tmp.path() / "cont" / tail), read_all(tmp.path() / "full" / tail));
  EXPECT_EQ(cont.weights_sha256, full.weights_sha256);
  // The report lists them apart from this run's steps, which alone have timings.
  const nlohmann::json report = report_json(cont);
  ASSERT_EQ(report["history"].size(), 3u);
  EXPECT_EQ(report["history"][0]["step"], 1);
  EXPECT_EQ(report["history"][1]["val_loss"], *full.steps[1].val_loss);
  EXPECT_FALSE(report["history"][0].contains("seconds"));
  EXPECT_FALSE(report["history"][0].contains("mfu"));
  ASSERT_EQ(report["steps"].size(), 3u);
  EXPECT_EQ(report["steps"][0]["step"], 4);
}

TEST(History, ACheckpointWithoutOneResumesAndItsHistoryStartsThere) {
  TempDir tmp;
  TrainConfig c = tiny_config(2, 2);
  c.steps = 6;
  c.checkpoint_dir = (tmp.path() / "full").string();
  c.checkpoint_every = 3;
  const TrainResult full = run(c);
  // A checkpoint as an earlier version wrote it: no history file, none listed.
  const fs::path at3 = tmp.path() / "full" / "step_00000003";
  nlohmann::ordered_json meta = nlohmann::ordered_json::parse(read_all(at3 / "meta.json"));
  ASSERT_EQ(meta["files"].back()["name"], std::string(checkpoint::kHistoryFile));
  meta["files"].erase(meta["files"].size() - 1);
  std::ofstream(at3 / "meta.json") << meta.dump(2) << "\n";
  fs::remove(at3 / checkpoint::kHistoryFile);
  TrainConfig r = c;
  r.checkpoint_dir = (tmp.path() / "cont").string();
  r.resume = at3.string();
  const TrainResult cont = run(r);
  EXPECT_TRUE(cont.history.empty());
  EXPECT_EQ(losses(cont), tail(losses(full), 3));
  EXPECT_EQ(cont.weights_sha256, full.weights_sha256);
  // From there on the history is carried: steps 4..6, and a continuation of it reports them.
  r.resume = "latest";
  r.steps = 7;
  const TrainResult next = run(r);
  ASSERT_EQ(next.history.size(), 3u);
  EXPECT_EQ(next.history.front().step, 4);
  EXPECT_EQ(history_fields(next.history), history_fields(cont.steps));
}

// A small text file whose epoch is a few steps long, so saves fall on its boundary.
fs::path write_text(const fs::path& dir) {
  const fs::path p = dir / "text.txt";
  std::ofstream out(p, std::ios::binary);
  for (int i = 0; i < 60; ++i) out << fmt::format("verse {} of a short book, said twice.\n", i);
  return p;
}

TEST(ResumeAt, AnEpochBoundaryContinuesIntoTheNextEpoch) {
  TempDir tmp;
  TrainConfig c = tiny_config(2, 1);
  c.data = write_text(tmp.path()).string();
  c.steps = 12;
  c.checkpoint_dir = (tmp.path() / "full").string();
  c.checkpoint_every = 1;
  const TrainResult full = run(c);
  // Find the checkpoint saved at the end of the first epoch.
  int boundary = 0;
  for (int s = 1; s < 12 && boundary == 0; ++s) {
    const checkpoint::Checkpoint k(tmp.path() / "full" / checkpoint::step_dir_name(s));
    if (k.meta().data_epoch == 1 && k.meta().data_step == 0) boundary = s;
  }
  ASSERT_GT(boundary, 0) << "no save fell on an epoch boundary; the text is too long";
  TrainConfig r = c;
  r.checkpoint_dir = (tmp.path() / "cont").string();
  r.resume = (tmp.path() / "full" / checkpoint::step_dir_name(boundary)).string();
  const TrainResult cont = run(r);
  EXPECT_EQ(losses(cont), tail(losses(full), static_cast<size_t>(boundary)));
  EXPECT_EQ(cont.weights_sha256, full.weights_sha256);
}

TEST(ResumeAt, AnFp16OverflowStreakKeepsTheScalerState) {
  TempDir tmp;
  TrainConfig c = tiny_config(2, 2, Precision::kFP16);
  c.initial_loss_scale = 16777216.0f;  // 2^24: the first steps overflow and halve it
  c.steps = 8;
  c.checkpoint_dir = (tmp.path() / "full").string();
  c.checkpoint_every = 1;
  const TrainResult full = run(c);
  ASSERT_TRUE(full.steps[0].skipped && full.steps[1].skipped)
      << "the scale no longer overflows at the start; the streak this test needs is gone";
  const checkpoint::Checkpoint k(tmp.path() / "full" / "step_00000002");
  ASSERT_TRUE(k.meta().loss_scaler);
  EXPECT_LT(k.meta().loss_scaler->scale, 16777216.0);
  EXPECT_EQ(k.meta().adam_step, 0);
  TrainConfig r = c;
  r.checkpoint_dir = (tmp.path() / "cont").string();
  r.resume = (tmp.path() / "full" / "step_00000002").string();
  const TrainResult cont = run(r);
  EXPECT_EQ(losses(cont), tail(losses(full), 2));
  for (size_t i = 0; i < cont.steps.size(); ++i) {
    EXPECT_EQ(cont.steps[i].skipped, full.steps[i + 2].skipped) << "step " << i + 3;
    EXPECT_EQ(cont.steps[i].loss_scale, full.steps[i + 2].loss_scale) << "step " << i + 3;
  }
  EXPECT_EQ(cont.weights_sha256, full.weights_sha256);
}

// Saves at (N, stage), re-saves at (M, stage') with nothing left to train, and back.
struct ReshardCase {
  int n, stage, m, stage2;
  Precision precision;
};

void PrintTo(const ReshardCase& c, std::ostream* os) {
  *os << fmt::format("{}@stage{} -> {}@stage{} {}", c.n, c.stage, c.m, c.stage2,
                     precision_name(c.precision));
}

class Reshard : public ::testing::TestWithParam<ReshardCase> {};

TEST_P(Reshard, RoundTripsAreBitIdenticalAndTrainingContinues) {
  const ReshardCase p = GetParam();
  TempDir tmp;
  TrainConfig a = tiny_config(p.n, p.stage, p.precision);
  a.steps = 3;
  a.checkpoint_dir = (tmp.path() / "a").string();
  (void)run(a);

  TrainConfig b = tiny_config(p.m, p.stage2, p.precision);
  b.steps = 3;
  b.resume = a.checkpoint_dir;
  b.checkpoint_dir = (tmp.path() / "b").string();
  const TrainResult rb = run(b);
  EXPECT_TRUE(rb.steps.empty());
  const checkpoint::Checkpoint kb(tmp.path() / "b" / "step_00000003");
  EXPECT_EQ(kb.meta().world_size, p.m);
  EXPECT_EQ(kb.meta().stage, p.stage2);
  EXPECT_EQ(states(tmp.path() / "b"), states(tmp.path() / "a"));

  TrainConfig c = a;
  c.resume = b.checkpoint_dir;
  c.checkpoint_dir = (tmp.path() / "c").string();
  (void)run(c);
  const fs::path sa = tmp.path() / "a" / "step_00000003", sc = tmp.path() / "c" / "step_00000003";
  for (int r = 0; r < p.n; ++r) {
    EXPECT_EQ(sha256_file_hex(sa / checkpoint::rank_file_name(r)),
              sha256_file_hex(sc / checkpoint::rank_file_name(r)))
        << "rank " << r << " after " << p.n << " -> " << p.m << " -> " << p.n;
  }

  // Training goes on from the resharded checkpoint, at M ranks.
  TrainConfig d = b;
  d.steps = 5;
  d.resume = b.checkpoint_dir;
  d.checkpoint_dir = (tmp.path() / "d").string();
  const TrainResult rd = run(d);
  ASSERT_EQ(rd.steps.size(), 2u);
  EXPECT_TRUE(std::isfinite(rd.steps.back().loss));
}

INSTANTIATE_TEST_SUITE_P(Pairs, Reshard,
                         ::testing::Values(ReshardCase{3, 1, 4, 3, Precision::kBF16},
                                           ReshardCase{4, 3, 3, 1, Precision::kBF16},
                                           ReshardCase{1, 0, 2, 2, Precision::kFP32},
                                           ReshardCase{2, 2, 1, 0, Precision::kFP16},
                                           ReshardCase{8, 3, 5, 0, Precision::kBF16},
                                           ReshardCase{5, 0, 8, 3, Precision::kFP32}));

TEST(Reshard, AnotherPrecisionLoadsTheMasterWeights) {
  TempDir tmp;
  TrainConfig a = tiny_config(2, 1, Precision::kFP32);
  a.steps = 2;
  a.checkpoint_dir = (tmp.path() / "a").string();
  (void)run(a);
  TrainConfig b = tiny_config(2, 1, Precision::kBF16);
  b.steps = 2;
  b.resume = a.checkpoint_dir;
  b.checkpoint_dir = (tmp.path() / "b").string();
  (void)run(b);
  const checkpoint::Checkpoint ka(tmp.path() / "a" / "step_00000002");
  const checkpoint::Checkpoint kb(tmp.path() / "b" / "step_00000002");
  for (size_t u = 0; u < ka.meta().units.size(); ++u) {
    std::vector<float> wa(ka.meta().units[u].numel), wb(wa.size());
    ka.read_master(u, 0, wa);
    kb.read_master(u, 0, wb);
    EXPECT_EQ(wa, wb) << "unit " << u;
  }
}

// 6 steps of 12 samples in the invariant order, so that any rank count that divides them
// continues a checkpoint with the same bits; 8-bit moments or fp32.
TrainConfig moments_config(int ranks, int stage, bool int8) {
  TrainConfig c = tiny_config(ranks, stage);
  c.micro_batch = 2;
  c.grad_accum = 12 / ranks;
  c.accumulate = AccumulatePolicy::kReduce;
  c.invariant = true;
  c.steps = 6;
  c.int8_moments = int8;
  return c;
}

// --optimizer-states int8 (train/moments_io.h): a checkpoint holds the codes and scales, so a
// continuation on other ranks and another stage is the run that never stopped; an fp32
// checkpoint continues with 8-bit moments (encoded as a step would) and an 8-bit one with
// fp32 moments (decoded), each the same bits on every rank count.
TEST(Reshard, Int8MomentsResumeBitExactAnywhereAndConvertBothWays) {
  TempDir tmp;
  const std::string whole = run(moments_config(2, 1, true)).weights_sha256;
  for (bool int8 : {true, false}) {
    TrainConfig first = moments_config(2, 1, int8);
    first.checkpoint_dir = (tmp.path() / (int8 ? "int8" : "fp32")).string();
    first.stop_after = 3;
    (void)run(first);
    // Continued with the other moments: the same bits on every rank count and stage.
    std::string converted;
    for (auto [n, stage] : {std::pair{3, 3}, std::pair{4, 0}}) {
      const std::string where =
          fmt::format("from {} on N={} stage {}", int8 ? "int8" : "fp32", n, stage);
      TrainConfig same = moments_config(n, stage, int8);
      same.resume = (tmp.path() / (int8 ? "int8" : "fp32") / "step_00000003").string();
      if (int8) {
        EXPECT_EQ(run(same).weights_sha256, whole) << where;
      }
      TrainConfig other = moments_config(n, stage, !int8);
      other.resume = same.resume;
      const TrainResult r = run(other);
      ASSERT_FALSE(r.stopped.has_value()) << where;
      EXPECT_TRUE(std::isfinite(r.steps.back().loss)) << where;
      if (converted.empty()) converted = r.weights_sha256;
      EXPECT_EQ(r.weights_sha256, converted) << where;
    }
  }
}

// meta.json names the code of the 8-bit moments' bytes. A checkpoint whose bytes are in
// another code (the decades code of checkpoints written before the field, which is what no
// field means) is decoded with it and encoded in the current code as a step would: the same
// bits on every rank count and stage. The label is what decides: the same bytes labelled
// decades continue differently from their own run.
TEST(Reshard, Int8MomentsOfAnotherCodeAreDecodedWithItAndConvertedAnywhere) {
  TempDir tmp;
  const std::string whole = run(moments_config(2, 1, true)).weights_sha256;
  TrainConfig first = moments_config(2, 1, true);
  first.checkpoint_dir = (tmp.path() / "saved").string();
  first.stop_after = 3;
  (void)run(first);
  const fs::path saved = tmp.path() / "saved" / "step_00000003";
  const nlohmann::json meta = nlohmann::json::parse(std::ifstream(saved / "meta.json"));
  EXPECT_EQ(meta["optimizer"]["moment_code"], "e3m4/ue4m4");
  // The same shards under another meta.json: its optimizer.moment_code set, or removed.
  const auto relabelled = [&](const std::string& name, const nlohmann::json* code) {
    const fs::path dir = tmp.path() / name / "step_00000003";
    fs::create_directories(dir.parent_path());
    fs::copy(saved, dir, fs::copy_options::recursive);
    nlohmann::json m = meta;
    if (code != nullptr) {
      m["optimizer"]["moment_code"] = *code;
    } else {
      m["optimizer"].erase("moment_code");
    }
    std::ofstream(dir / "meta.json") << m.dump(2);
    return dir.string();
  };
  const auto continued = [&](const std::string& from, int n, int stage, bool int8 = true) {
    TrainConfig c = moments_config(n, stage, int8);
    c.resume = from;
    const TrainResult r = run(c);
    EXPECT_FALSE(r.stopped.has_value()) << from;
    EXPECT_TRUE(std::isfinite(r.steps.back().loss)) << from;
    return r.weights_sha256;
  };
  const nlohmann::json current = "e3m4/ue4m4", decades = "decades", bogus = "e5m2";
  EXPECT_EQ(continued(relabelled("current", &current), 3, 3), whole);
  const std::string as_decades = relabelled("decades", &decades);
  const std::string converted = continued(as_decades, 3, 3);
  EXPECT_NE(converted, whole);
  EXPECT_EQ(continued(as_decades, 4, 0), converted);
  EXPECT_EQ(continued(relabelled("unlabelled", nullptr), 2, 1), converted);
  // An fp32-moment run decodes them with the same code: continued on two layouts alike.
  EXPECT_EQ(continued(as_decades, 2, 0, false), continued(as_decades, 3, 3, false));
  TrainConfig unknown = moments_config(2, 1, true);
  unknown.resume = relabelled("bogus", &bogus);
  try {
    (void)run(unknown);
    ADD_FAILURE() << "a checkpoint of an unknown moment code loaded";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.moment_code is \"e5m2\""), std::string::npos)
        << e.what();
  }
}

// --- the protocol ---------------------------------------------------------------------

TEST(Protocol, KeepDeletesOnlyOlderCommittedCheckpoints) {
  TempDir tmp;
  TrainConfig c = tiny_config(2, 2);
  c.steps = 5;
  c.checkpoint_dir = tmp.path().string();
  c.checkpoint_every = 1;
  c.keep = 2;
  (void)run(c);
  const auto all = checkpoint::list_checkpoints(tmp.path());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].filename(), "step_00000004");
  EXPECT_EQ(all[1].filename(), "step_00000005");
  EXPECT_EQ(checkpoint::find_latest(tmp.path())->filename(), "step_00000005");
  for (const auto& e : fs::directory_iterator(tmp.path())) {
    EXPECT_FALSE(e.path().filename().string().starts_with(".tmp")) << e.path();
  }
}

TEST(Protocol, LeftoverTemporariesAreCleanedAtTheNextStart) {
  TempDir tmp;
  TrainConfig c = tiny_config(2, 0);
  c.steps = 2;
  c.checkpoint_dir = tmp.path().string();
  (void)run(c);
  fs::create_directories(tmp.path() / ".tmp.step_00000003");
  std::ofstream(tmp.path() / ".tmp.step_00000003" / "rank_00000.safetensors") << "half";
  std::ofstream(tmp.path() / "latest.tmp") << "step_0000";
  TrainConfig r = c;
  r.steps = 3;
  r.resume = "latest";
  (void)run(r);
  EXPECT_FALSE(fs::exists(tmp.path() / "latest.tmp"));
  EXPECT_EQ(checkpoint::find_latest(tmp.path())->filename(), "step_00000003");
  EXPECT_TRUE(fs::exists(tmp.path() / "step_00000003" / "rank_00001.safetensors"));
}

TEST(Protocol, AFreshStartRefusesADirectoryWithCheckpoints) {
  TempDir tmp;
  TrainConfig c = tiny_config(1, 0);
  c.steps = 1;
  c.checkpoint_dir = tmp.path().string();
  (void)run(c);
  try {
    (void)run(c);
    FAIL() << "a fresh run wrote over committed checkpoints";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--resume latest"), std::string::npos) << e.what();
  }
}

TEST(Protocol, ResumeWithNothingToResumeIsAnError) {
  TempDir tmp;
  TrainConfig c = tiny_config(1, 0);
  c.steps = 2;
  c.checkpoint_dir = tmp.path().string();
  c.resume = "latest";
  EXPECT_THROW((void)run(c), InvalidArgument);
  c.resume = (tmp.path() / "nowhere").string();
  EXPECT_THROW((void)run(c), InvalidArgument);
  EXPECT_TRUE(checkpoint::list_checkpoints(tmp.path()).empty());
}

TEST(Protocol, ResumingPastStepsIsAnError) {
  TempDir tmp;
  TrainConfig c = tiny_config(1, 0);
  c.steps = 3;
  c.checkpoint_dir = tmp.path().string();
  (void)run(c);
  c.steps = 2;
  c.resume = "latest";
  try {
    (void)run(c);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--steps 3 or more"), std::string::npos) << e.what();
  }
}

// --- corruption -----------------------------------------------------------------------

class Corruption : public ::testing::Test {
 protected:
  void SetUp() override {
    TrainConfig c = tiny_config(2, 1);
    c.steps = 4;
    c.checkpoint_every = 2;
    c.checkpoint_dir = tmp_.path().string();
    (void)run(c);
    base_ = c;
  }
  fs::path step(int s) const { return tmp_.path() / checkpoint::step_dir_name(s); }
  // One bit of the file's fifth byte from the end: its data, not its header.
  static void flip_a_bit_near_the_end(const fs::path& f) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-5, std::ios::end);
    char b = 0;
    io.read(&b, 1);
    io.seekp(-5, std::ios::end);
    b = static_cast<char>(b ^ 0x10);
    io.write(&b, 1);
  }
  // Resumes from step 4 and returns the error text; fails the test when it loads.
  std::string refused(const TrainConfig& c) {
    try {
      (void)run(c);
    } catch (const CorruptData& e) {
      return e.what();
    }
    ADD_FAILURE() << "a damaged checkpoint loaded";
    return "";
  }
  TrainConfig resume_config() const {
    TrainConfig r = base_;
    r.steps = 6;
    r.checkpoint_dir = (tmp_.path() / "out").string();
    r.resume = step(4).string();
    return r;
  }
  TempDir tmp_;
  TrainConfig base_;
};

TEST_F(Corruption, ATruncatedShardNamesTheFileAndBothSizes) {
  const fs::path f = step(4) / "rank_00001.safetensors";
  const auto size = fs::file_size(f);
  fs::resize_file(f, size - 10);
  const std::string e = refused(resume_config());
  EXPECT_NE(e.find("rank_00001.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string(size)), std::string::npos) << e;
}

TEST_F(Corruption, AFlippedByteFailsTheChecksum) {
  const fs::path f = step(4) / "rank_00000.safetensors";
  flip_a_bit_near_the_end(f);
  const std::string e = refused(resume_config());
  EXPECT_NE(e.find("rank_00000.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("crc32c"), std::string::npos) << e;
}

// Checkpoints written before CRC-32C list a sha256 per file: they load, checked with it, and
// continue as the run with the new digests does; a flipped byte is still refused.
TEST_F(Corruption, ACheckpointFromBeforeCrc32cIsCheckedWithItsSha256) {
  TrainConfig first = resume_config();
  first.checkpoint_dir = (tmp_.path() / "first").string();
  const std::string want = run(first).weights_sha256;
  const fs::path meta = step(4) / "meta.json";
  nlohmann::json j = nlohmann::json::parse(read_all(meta));
  for (auto& f : j["files"]) {
    ASSERT_TRUE(f.contains("crc32c")) << f.dump();
    EXPECT_EQ(f["crc32c"], crc32c_file_hex(step(4) / f["name"].get<std::string>()));
    f.erase("crc32c");
    f["sha256"] = sha256_file_hex(step(4) / f["name"].get<std::string>());
  }
  std::ofstream(meta, std::ios::binary) << j.dump(2);
  EXPECT_EQ(run(resume_config()).weights_sha256, want);
  const fs::path f = step(4) / "rank_00001.safetensors";
  flip_a_bit_near_the_end(f);
  TrainConfig again = resume_config();
  again.checkpoint_dir = (tmp_.path() / "again").string();
  const std::string e = refused(again);
  EXPECT_NE(e.find("rank_00001.safetensors: sha256"), std::string::npos) << e;
}

TEST_F(Corruption, ADamagedHistoryIsNamed) {
  const fs::path f = step(4) / checkpoint::kHistoryFile;
  std::string text = read_all(f);
  text.replace(text.find("\"step\":2"), 8, "\"step\":7");  // same size
  std::ofstream(f, std::ios::binary) << text;
  const std::string e = refused(resume_config());
  EXPECT_NE(e.find("history.jsonl"), std::string::npos) << e;
  EXPECT_NE(e.find("crc32c"), std::string::npos) << e;
}

TEST_F(Corruption, AMissingShardIsNamed) {
  fs::remove(step(4) / "rank_00001.safetensors");
  const std::string e = refused(resume_config());
  EXPECT_NE(e.find("rank_00001.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
}

TEST_F(Corruption, AShardFromAnotherStepIsCaught) {
  fs::copy_file(step(2) / "rank_00000.safetensors", step(4) / "rank_00000.safetensors",
                fs::copy_options::overwrite_existing);
  const std::string e = refused(resume_config());
  EXPECT_NE(e.find("rank_00000.safetensors"), std::string::npos) << e;
}

TEST_F(Corruption, ACheckpointOfAnotherModelIsRefused) {
  TrainConfig r = resume_config();
  r.layers = 3;  // tiny has 2
  const std::string e = refused(r);
  EXPECT_NE(e.find("another model"), std::string::npos) << e;
}

TEST_F(Corruption, ABadMetaFieldIsNamed) {
  const fs::path meta = step(4) / "meta.json";
  std::ifstream in(meta);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const auto at = text.find("\"world_size\": 2");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 15, "\"world_size\": \"2\"");
  std::ofstream(meta) << text;
  const std::string e = refused(resume_config());
  EXPECT_NE(e.find("world_size"), std::string::npos) << e;
}

TEST_F(Corruption, ANumberPastSixtyFourBitsIsCorruptNotACrash) {
  // Found by the fuzzer: nlohmann throws out_of_range, not parse_error, for these.
  const fs::path meta = step(4) / "meta.json";
  std::ifstream in(meta);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const auto at = text.find("\"step\": 4");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 9, "\"step\": 4E94972");
  std::ofstream(meta) << text;
  const std::string e = refused(resume_config());
  EXPECT_NE(e.find("meta.json"), std::string::npos) << e;
}

TEST_F(Corruption, NothingIsWrittenWhenLoadingFails) {
  fs::remove(step(4) / "rank_00001.safetensors");
  (void)refused(resume_config());
  EXPECT_TRUE(checkpoint::list_checkpoints(tmp_.path() / "out").empty());
}

// --- export ---------------------------------------------------------------------------

TEST(Export, HoldsTheConsolidatedMasterUnderCanonicalNames) {
  TempDir tmp;
  TrainConfig c = tiny_config(3, 3);
  c.steps = 2;
  c.checkpoint_dir = (tmp.path() / "ck").string();
  c.keep_final_weights = true;
  const TrainResult r = run(c);
  const fs::path out = tmp.path() / "model.safetensors";
  const auto s = checkpoint::export_fp32(tmp.path() / "ck", out, 1000);
  EXPECT_LE(s.buffer_bytes, 4000u + 64u);
  const safetensors::Reader file(out);
  EXPECT_EQ(file.header().metadata.at("format"), checkpoint::kExportFormat);
  EXPECT_EQ(file.header().metadata.at("layers"), "2");
  // The final weights in canonical order are the tensors in file order.
  std::vector<float> all;
  for (const auto& t : file.header().tensors) {
    std::vector<float> v(t.numel());
    file.read(t, 0, std::as_writable_bytes(std::span(v)));
    all.insert(all.end(), v.begin(), v.end());
  }
  EXPECT_EQ(all, r.final_weights);
  EXPECT_NE(file.find("h.1.attn.c_attn.weight"), nullptr);
  EXPECT_EQ(file.find("h.1.attn.c_attn.weight")->shape, (std::vector<int64_t>{96, 32}));
}

}  // namespace
}  // namespace zerodp
