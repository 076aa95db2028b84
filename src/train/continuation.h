// A continuation (--resume, an elastic restart) on another rank count: the batch it keeps and
// the order it sums in.
#pragma once

#include <filesystem>
#include <string>

#include "checkpoint/format.h"
#include "train/config.h"

namespace zerodp {

// A continuation keeps the checkpoint's samples per optimizer step, K = N b A, unless
// --grad-accum was given: A' = K / (N' b') on N' ranks of micro-batch b'. A rank count that
// cannot split K evenly is refused, naming the counts that can (with --islands, multiples of
// the islands). `default_policy`: the accumulation policy is the default: the checkpoint's
// canonical order is kept (reduce), else the default is chosen again for A'.
// `world`: the ranks that split a step's samples (islands in turn: every island's share of
// each rank, islands x ranks).
// Returns why the continuation's bits may differ from the run that never stopped (another
// A' outside the canonical order), or empty when they cannot.
std::string keep_global_batch(TrainConfig& cfg, const std::filesystem::path& from,
                              const checkpoint::Meta& m, int world, bool default_policy);

}  // namespace zerodp
