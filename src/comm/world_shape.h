// The rule a world's shape keeps, written once for every place that learns the world's rank
// count: train's local --ranks, each row of estimate's --ranks list, the world an MPI launch
// made (the communicator, the planner, a launched rank). A count that must split the world
// into equal parts (--node-ranks' ranks per node, --islands' islands) is refused naming the
// option, the world as the user named it, and what would fit.
#pragma once

#include <string_view>

namespace zerodp {

// How the user named the world, which decides the words and the fix a refusal offers.
enum class WorldNamed {
  kRanks,      // --ranks N, one world (train's local backend): use a divisor of N
  kRanksList,  // one of estimate's --ranks rows: use rank counts that are multiples of it
  kLaunched,   // the world N processes and their threads made: launch a multiple, or a divisor
};

// Whether `by` splits a world of `world` ranks into equal parts (0 the whole world, where
// `zero_is_whole`): the rule check_divides_world words, cheap enough for a search over worlds.
bool divides_world(int by, int world, bool zero_is_whole = false);

// InvalidArgument "FLAG BY does not divide WORLD: WHY; FIX" unless `by` divides `world`;
// `by` below 1 is refused the same way, 0 excepted where `zero_is_whole` (--node-ranks 0:
// one node).
void check_divides_world(std::string_view flag, int by, int world, std::string_view why,
                         WorldNamed named, bool zero_is_whole = false);

// What a --node-ranks that no world takes (below 0) should be: train's option table says it
// too.
inline constexpr std::string_view kNodeRanksAdvice =
    "use the ranks per node (1 or more), or leave it out for one node";

// The world is whole nodes of `node_ranks` ranks (0: one node, the whole world); a negative
// count is refused as a value, with kNodeRanksAdvice.
void check_whole_nodes(int node_ranks, int world, WorldNamed named);

// --ranks-per-process T, the rank threads of each MPI process: 1 or more, only with the MPI
// backend (the local one runs every rank as a thread already), and a divisor of --node-ranks,
// since a process's threads share its node, unless one process is the whole job. `processes`
// is the job's MPI processes, 0 before they are launched: that rule then waits for the
// launch, which alone knows whether one process is the job.
void check_process_ranks(int per_process, bool mpi, int node_ranks, int processes);

}  // namespace zerodp
