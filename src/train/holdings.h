// What one rank of a run holds, by ledger category: the one answer the forecast
// (train/forecast.h), the memory preflight (train/setup.h), the budget advice and the
// report's plan (the ledger's expectations) read. Its parts come from the code the engine
// allocates by: the units' state layout (train/state_layout.h) for the model states, the
// transient layout (transient_plan) for the buffers, the outer step's and the checkpoint
// staging's sizes (train/plan.h); so islands, islands in turn, 8-bit moments, HSDP and
// offload are seen everywhere the holdings are, and nowhere restated. O(units) per call.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "memory/ledger.h"
#include "models/unit.h"
#include "train/config.h"
#include "train/plan.h"

namespace zerodp {

// The model as the planner sees it: the units' element counts and, for a model with layers,
// the model itself, whose activations and buffers are laid out as the engine allocates them.
// Without one (`zerodp estimate --params`, a report read back), no transients.
struct PlannedModel {
  std::vector<uint64_t> units{};
  // Each unit's tensors' sizes (8-bit moments need them); empty: one tensor a unit.
  UnitTensors tensors{};
  const Model* model = nullptr;
  int layers = 0, seq_len = 0, embd = 0;  // for the FLOPs per token; 0 without a model
  uint64_t features_per_sample = 0;       // an image's floats; 0 for text (seq_len tokens)
};
// The planner's view of a built model (its units and tensors).
PlannedModel planned_model(const Model& model);

struct Holdings {
  // The model states of every island the rank hosts (train/state_layout.h); nvme: its
  // offload files, which are disk, not memory.
  StateBytes states;
  std::optional<TransientBytes> transients;  // with a model
  // --islands: the outer step's buffers (outer_layout), and what the state layout keeps per
  // island hosted for it.
  uint64_t outer_state = 0;
  uint64_t checkpoint_staging = 0;  // --checkpoint-async's (checkpoint_staging_bytes)
  // Every byte of memory: what the ledger's peak total reaches.
  uint64_t memory() const;
  // The same by ledger category (the ledger's peaks, category by category).
  MemoryLedger::Table by_category() const;
};

// Rank `rank` of `c` run at `world` ranks. A run with --checkpoint-async is taken to save
// (the option table calls it idle without --checkpoint-dir, and refuses it).
Holdings rank_holdings(const TrainConfig& c, const PlannedModel& m, int world, int rank);

}  // namespace zerodp
