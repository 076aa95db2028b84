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
#include "train/sharded_state.h"
#include "train/state_store.h"

namespace zerodp {

// The moment tensors of unit `u`'s own range, appended in the file's order.
void int8_moment_decls(const UnitState& u, std::vector<safetensors::TensorDecl>& decls);
// Their bytes, in that order: unit `u` (index i) of a state whose codes are in `store`
// when it is the offload file's.
void stream_int8_moments(const UnitState& u, size_t i, StateStore& store,
                         const std::function<void(std::span<const std::byte>)>& sink);
// Of those, what memory holds whether or not the codes are offloaded: the scales and the fp32
// parts, in the file's order (after the codes).
void stream_int8_moments_in_memory(const UnitState& u,
                                   const std::function<void(std::span<const std::byte>)>& sink);
// Unit `i`'s moments from `ckpt` (with islands, `island`'s) into `state` (through `store` when
// they are fp32 or offloaded there), whichever of the checkpoint and the state holds 8-bit
// moments.
void load_moments(ShardedState& state, StateStore& store, const checkpoint::Checkpoint& ckpt,
                  size_t i, int island = 0);

}  // namespace zerodp
