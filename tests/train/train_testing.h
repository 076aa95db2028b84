// Running the engine in-process for tests: a tiny GPT on synthetic text, quiet.
#pragma once

#include <string>

#include "train/engine.h"

namespace zerodp::testing {

inline TrainConfig tiny_config(int ranks, int stage, Precision precision = Precision::kBF16) {
  TrainConfig c;
  c.model = "gpt";
  c.size = "tiny";
  c.data = "synthetic";
  c.launch.backend = Backend::kLocal;
  c.launch.ranks = ranks;
  c.launch.comm.timeout_seconds = 60;
  c.stage = stage;
  c.precision = precision;
  c.micro_batch = 4;
  // Given, so a resume on another rank count changes the batch as tests ask (0 would keep
  // the checkpoint's).
  c.grad_accum = 1;
  c.steps = 3;
  c.eval_batches = 1;
  c.progress = false;
  c.accumulate = stage >= 2 ? AccumulatePolicy::kReduce : AccumulatePolicy::kLocal;
  return c;
}

inline TrainResult run(const TrainConfig& c) {
  int argc = 1;
  char name[] = "test";
  char* args[] = {name, nullptr};
  char** argv = args;
  return train(c, argc, argv);
}

}  // namespace zerodp::testing
