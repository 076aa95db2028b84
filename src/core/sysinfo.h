// Facts of the machine a run checks itself against before allocating.
#pragma once

#include <cstdint>
#include <optional>

namespace zerodp {

// Bytes the machine can still give without swapping (/proc/meminfo's MemAvailable);
// nullopt where that is not known.
std::optional<uint64_t> available_memory();

}  // namespace zerodp
