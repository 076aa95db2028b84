// What meta.json says of a run, and the model check a resume makes, from the parts they
// need and no trainer: a configuration, states built for it, the run's data and counters.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/format.h"
#include "checkpoint/store.h"
#include "core/error.h"
#include "memory/ledger.h"
#include "models/model.h"
#include "temp_dir.h"
#include "train/checkpoint_resume.h"
#include "train/checkpoint_shards.h"
#include "train/setup.h"
#include "train/sharded_state.h"
#include "train/state_layout.h"
#include "train_testing.h"

namespace zerodp {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr int kRanks = 2;
constexpr int64_t kSteps = 3;

// A run of kRanks ranks that saved its last step, fp16 so the meta holds a loss scaler.
struct SavedRun {
  TrainConfig config;  // resolved, as the trainer had it
  fs::path dir;        // its checkpoint of step kSteps
};

SavedRun saved_run(const TempDir& tmp) {
  TrainConfig c = testing::tiny_config(kRanks, 2, Precision::kFP16);
  c.steps = kSteps;
  c.checkpoint_dir = (tmp.path() / "ck").string();
  c.checkpoint_every = kSteps;
  const TrainResult r = testing::run(c);
  return {r.config, tmp.path() / "ck" / checkpoint::step_dir_name(kSteps)};
}

// Rank 0's states of `cfg`'s model, split over kRanks ranks as the run split them.
StatesMeta states_of(const TrainConfig& cfg) {
  const Model model = build_model(cfg);
  MemoryLedger ledger;
  const ShardedState state(model, layout_plan(cfg), false, cfg.decay_all, cfg.seed, kRanks, 0,
                           ledger);
  return states_meta(state, kRanks);
}

std::string file_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(CheckpointMeta, DescribedFromConfigStatesAndCountersAsTheTrainerDescribedIt) {
  TempDir tmp;
  const SavedRun run = saved_run(tmp);
  const checkpoint::Meta saved = checkpoint::read_meta(run.dir);
  ASSERT_TRUE(saved.loss_scaler);
  // What the run's trainer held after its steps: its counters and its data.
  RunCounters counters{.optimizer = {.adam_step = saved.adam_step, .scaler = std::nullopt},
                       .data = {saved.data_epoch, saved.data_step},
                       .samples_chain = saved.samples_chain,
                       .samples_chain_from = saved.samples_chain_from,
                       .lr_next = saved.lr_next};
  counters.optimizer.scaler =
      LossScalerState{.scale = static_cast<float>(saved.loss_scaler->scale),
                      .clean_steps = saved.loss_scaler->clean_steps,
                      .hysteresis_left = saved.loss_scaler->hysteresis_left};
  const RunData data{.identity = saved.data_identity,
                     .samples_per_step = saved.samples_per_step,
                     .dataset_size = saved.dataset_size,
                     .steps_per_epoch = 0};
  checkpoint::Meta described =
      describe_checkpoint(run.config, states_of(run.config), data, counters, kSteps);
  // The files' checksums and hosts are the commit's, not the description's.
  EXPECT_TRUE(described.files.empty());
  described.files = saved.files;
  described.hosts = saved.hosts;
  EXPECT_EQ(checkpoint::to_json(described), file_text(run.dir / "meta.json"));
}

TEST(CheckpointMeta, SameModelCheckTakesTheUnitsAndRefusesAnotherModel) {
  TempDir tmp;
  const SavedRun run = saved_run(tmp);
  const checkpoint::Checkpoint ckpt(run.dir);
  const StatesMeta mine = states_of(run.config);
  EXPECT_NO_THROW(check_same_model(run.config, mine.units, ckpt));

  TrainConfig deeper = run.config;
  deeper.layers += 1;
  try {
    check_same_model(deeper, states_of(deeper).units, ckpt);
    FAIL() << "a model with another layer count loaded";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("a checkpoint of another model: "), std::string::npos)
        << e.what();
  }

  std::vector<checkpoint::UnitMeta> reshaped = mine.units;
  reshaped[1].tensors[0].shape.back() += 1;
  try {
    check_same_model(run.config, reshaped, ckpt);
    FAIL() << "a model with another tensor shape loaded";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find(": a checkpoint of another model: tensor 0 of unit " +
                                         mine.units[1].name + " is"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zerodp
