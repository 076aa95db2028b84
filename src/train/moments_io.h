// 8-bit Adam moments in checkpoints (--optimizer-states int8; checkpoint/format.h's
// Meta::int8_moments): what a shard holds of them, written from memory, and loaded into a run
// of any rank count, stage and moment precision.
//
// A shard holds, per unit, for its own range: "adam_m8"/"adam_v8", one code byte per element
// (0 for elements of tensors whose moments stay fp32), "adam_m8_scale"/"adam_v8_scale", the
// fp32 scales of the range's blocks in order, and "adam_m"/"adam_v", the fp32 moments of the
// range's elements of the small tensors. Codes are read by the unit's element ranges like
// any tensor; scales and fp32 parts are mapped to each saved rank's file by counting blocks
// and elements from its range's start (optim/moments8.h's moment_counts), which the saved
// partitions, cut on the block grid, make exact.
//
// Loading into an int8 run copies the codes and scales: a resume is bit-exact at any N and
// stage. Loading an int8 checkpoint into an fp32 run decodes them (the moments the saving run
// stepped with); loading an fp32 checkpoint into an int8 run encodes its moments by blocks, as
// a step would.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/store.h"
#include "train/checkpoint_shards.h"
#include "train/sharded_state.h"
#include "train/state_store.h"

namespace zerodp {

// The moment tensors of unit `i`'s own range, appended to `out` in the file's order: the
// codes from the store, the scales and the fp32 parts from the memory of whichever island
// of `state` is active when they are written.
void int8_moment_tensors(const ShardedState& state, size_t i, std::vector<ShardTensor>& out);
// Unit `i`'s moments from `ckpt` (with islands, `island`'s) into `state` (the codes and fp32
// moments through `store`, the scales and an 8-bit run's fp32 parts in memory), whichever of
// the checkpoint and the state holds 8-bit moments.
void load_moments(ShardedState& state, StateStore& store, const checkpoint::Checkpoint& ckpt,
                  size_t i, int island = 0);

}  // namespace zerodp
