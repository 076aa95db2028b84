// The training engine's entry point: a whole run on the configured backend, every rank
// running the one step loop that serves every ZeRO stage (train/rank_trainer.h has the loop
// and its parts; train/stage_plan.h what a stage makes it do). What a run produces is in
// train/result.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "models/model.h"
#include "train/config.h"
#include "train/result.h"

namespace zerodp {

// Called on rank 0 after every step (progress, metrics); `total` is config.steps.
using StepCallback = std::function<void(const StepRecord&, int64_t total)>;

// Runs the whole training on the configured backend. Under MPI every process calls it.
// Outputs are checked before the first step (train/outputs.h); rank 0 writes the report
// (config.report_path) and train() the trace. A stop requested while it
// runs (train/stop.h) ends it after the step every rank agrees on, with a checkpoint when
// checkpoint_dir is set; the result says so in `stopped`, as does --max-skips.
// `make_model`, when given, replaces the model config.model names; it is called once per
// rank and its model must consume the configured data (tokens of config.seq_len for text,
// pixel rows for images). config.model then only picks the kind of data
// (train/model_kind.h: "custom-text" or "custom-images").
TrainResult train(const TrainConfig& config, int& argc, char**& argv,
                  const StepCallback& on_step = {}, const ModelFactory& make_model = {});

}  // namespace zerodp
