// Initialization as a pure function of (seed, parameter, element index).
//
// A rank initializes exactly its own range of a unit's flat buffer, and the starting model
// is the same, bit for bit, for every world size and stage: element i of tensor t takes
// initial_value(seed, t, i) however the buffer is split.
//
// Normal values come from a counter-based generator: the splitmix64 sequence keyed by
// (seed, a hash of the tensor's NAME), read at positions 2i+1 and 2i+2, gives two uniforms,
// and Box-Muller's cosine branch (in double, rounded once to float) turns them into one
// N(0, 1) sample, scaled by the tensor's init_std. Keying by name (FNV-1a of the bytes), not
// by position, keeps a tensor's values when units are added or reordered. Only integer
// arithmetic and std::log / std::cos / std::sqrt of doubles are involved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "models/unit.h"

namespace zerodp {

// The initial value of element `index` (row-major, within the tensor) of tensor `t`.
float initial_value(uint64_t seed, const TensorSpec& t, size_t index);

// Fills out[i] with the initial value of element begin + i of the unit's flat buffer, for
// begin <= begin + i < end; the range may span tensors and start or end mid-tensor.
// Throws InvalidArgument unless begin <= end <= u.numel() and out holds end - begin.
void initialize_range(uint64_t seed, const Unit& u, size_t begin, size_t end, std::span<float> out);

// The whole flat buffer of one unit (a convenience for tests and tools).
std::vector<float> initial_weights(uint64_t seed, const Unit& u);

}  // namespace zerodp
