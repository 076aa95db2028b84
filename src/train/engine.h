// The training engine: one step loop for every ZeRO stage, the stage read as three switches.
//
// Per rank, each unit of the model owns (counts for Φ_u elements, own range c_u):
//   params  16-bit (fp32 at --precision fp32)   Φ_u, or c_u when sharding.parameters
//   grads   same dtype                          Φ_u, or c_u when sharding.gradients
//   master  fp32 (none at fp32: params are it)  Φ_u, or c_u when sharding.optimizer_states
//   adam_m, adam_v  fp32                        as master
// One step: A micro-batches of forward and backward over the units, gradients reduced by
// the policy (--accumulate), overflow and norm agreed on the owned ranges, AdamW on the
// optimizer range, updated parameters rounded and (stages 1-2) all-gathered. Stage 3
// gathers a unit's parameters before its forward and again before its backward.
#pragma once

#include <array>
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
// pixel rows for images). config.model then only picks the kind of data: "gpt" or "custom-text" for
// text, "mlp" or "custom-images" for images.
TrainResult train(const TrainConfig& config, int& argc, char**& argv,
                  const StepCallback& on_step = {}, const ModelFactory& make_model = {});

}  // namespace zerodp
