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

// Called as a restart begins (--max-restarts), before the survivors' first step.
using RestartCallback = std::function<void(const Restart&)>;

// Runs the whole training on the configured backend. Under MPI every process calls it.
// Outputs are checked before the first step (train/outputs.h); rank 0 writes the report
// (config.report_path) and train() the trace. A stop requested while it
// runs (train/stop.h) ends it after the step every rank agrees on, with a checkpoint when
// checkpoint_dir is set; the result says so in `stopped`, as does --max-skips.
// `make_model`, when given, replaces the model config.model names; it is called once per
// rank and its model must consume the configured data (tokens of config.seq_len for text,
// pixel rows for images). config.model then only picks the kind of data
// (train/model_kind.h: "custom-text" or "custom-images").
//
// Elastic restarts (config.max_restarts > 0, local backend only): when a rank fails during
// a step, on_restart is told and the run reloads the latest checkpoint in checkpoint_dir
// and continues on N' ranks, the largest divisor of the step's micro-batches M = N x A that
// is below N (one rank lost), with A' = M / N' (the batch kept; under the canonical order
// the same bits as a run that never failed). The injections of the failed step and before
// do not fire again. Not restarted, and rethrown saying why: an error a restart cannot fix
// (a bad argument, corrupt data, memory, the disk), a failure before the first checkpoint,
// one rank left, or the restarts used up. The checkpoint directory's lock is held across.
TrainResult train(const TrainConfig& config, int& argc, char**& argv,
                  const StepCallback& on_step = {}, const ModelFactory& make_model = {},
                  const RestartCallback& on_restart = {});

}  // namespace zerodp
