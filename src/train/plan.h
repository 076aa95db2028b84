// What each rank must hold, computed before anything is allocated: the model-state bytes of
// the ZeRO table for any (N, stage, precision), exact for ragged partitions. The engine
// allocates exactly these (tests compare them with the ledger); budget errors use them to
// say which stage or rank count would fit.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "train/config.h"

namespace zerodp {

struct StateBytes {
  uint64_t params = 0;
  uint64_t grads = 0;
  uint64_t master = 0;
  uint64_t adam_m = 0;
  uint64_t adam_v = 0;
  uint64_t total() const { return params + grads + master + adam_m + adam_v; }
};

// Rank `rank`'s persistent model states: params and grads in the run's precision (2 bytes,
// or 4 at fp32), fp32 master (none at fp32) and Adam moments; each full or the rank's
// partition range of every unit, as the stage's switches say.
StateBytes model_state_bytes(std::span<const uint64_t> unit_numel, int world, int stage,
                             Precision precision, int rank);
// The largest over ranks (rank 0 holds the largest ranges).
StateBytes max_model_state_bytes(std::span<const uint64_t> unit_numel, int world, int stage,
                                 Precision precision);

// Bytes rank `rank` receives per training step, by collective (the comm ledger's
// definitions), for A micro-batches under the accumulation policy: stage 0 all-reduces
// each unit A_red times; stages 1-2 reduce-scatter A_red times and all-gather once; stage 3
// reduce-scatters A_red times and all-gathers 2A times (A_red = A for kReduce, 1 for kLocal).
struct CommBytes {
  uint64_t all_reduce = 0;
  uint64_t reduce_scatter = 0;
  uint64_t all_gather = 0;
  uint64_t total() const { return all_reduce + reduce_scatter + all_gather; }
};
CommBytes comm_bytes_per_step(std::span<const uint64_t> unit_numel, int world, int stage,
                              Precision precision, int grad_accum, AccumulatePolicy policy,
                              int rank);

// One sentence for a budget error: the model-state bytes per rank of every stage at this N,
// and the fewest ranks with which stage 3's states fit the budget.
std::string budget_advice(std::span<const uint64_t> unit_numel, int world, Precision precision,
                          uint64_t budget_bytes);

}  // namespace zerodp
