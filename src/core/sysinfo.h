// Facts of the machine a run checks itself against before allocating.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zerodp {

// Bytes the machine can still give without swapping (/proc/meminfo's MemAvailable);
// nullopt where that is not known.
std::optional<uint64_t> available_memory();

// The cores this process may run on: its CPU affinity mask (mpirun binds each process to
// one core by default when it starts two or fewer, to a socket beyond), else the
// machine's. At least 1.
int usable_cores();

// This host's name (gethostname; its UTS namespace's under a container or scripts/vcluster),
// "unknown host" when it has none.
std::string host_name();

}  // namespace zerodp
