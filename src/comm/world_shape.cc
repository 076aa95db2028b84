// world_shape.h is the contract.
#include "comm/world_shape.h"

#include <string>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {

bool divides_world(int by, int world, bool zero_is_whole) {
  return by > 0 ? world % by == 0 : by == 0 && zero_is_whole;
}

void check_divides_world(std::string_view flag, int by, int world, std::string_view why,
                         WorldNamed named, bool zero_is_whole) {
  if (divides_world(by, world, zero_is_whole)) return;
  std::string world_text = fmt::format("--ranks {}", world);
  std::string fix = fmt::format("use a divisor of {}", world);
  if (named == WorldNamed::kRanksList) fix = "use rank counts that are multiples of it";
  if (named == WorldNamed::kLaunched) {
    world_text = fmt::format("the world of {} ranks", world);
    fix = fmt::format("launch a multiple of {} ranks, or use a divisor of {}", by, world);
  }
  throw InvalidArgument(
      fmt::format("{} {} does not divide {}: {}; {}", flag, by, world_text, why, fix));
}

void check_whole_nodes(int node_ranks, int world, WorldNamed named) {
  if (node_ranks < 0) {
    throw InvalidArgument(
        fmt::format("--node-ranks {} is invalid; {}", node_ranks, kNodeRanksAdvice));
  }
  check_divides_world("--node-ranks", node_ranks, world, "a world is whole nodes", named,
                      /*zero_is_whole=*/true);
}

void check_process_ranks(int per_process, bool mpi, int node_ranks, int processes) {
  if (per_process < 1) {
    throw InvalidArgument(
        fmt::format("--ranks-per-process {} is invalid; use 1 or more rank threads per MPI process",
                    per_process));
  }
  if (per_process > 1 && !mpi) {
    throw InvalidArgument(fmt::format(
        "--ranks-per-process {} is for --backend mpi; the local backend already runs every "
        "rank as a thread of one process (use --ranks)",
        per_process));
  }
  if (processes > 1 && node_ranks > 0 && node_ranks % per_process != 0) {
    throw InvalidArgument(fmt::format(
        "--ranks-per-process {} does not divide --node-ranks {}: a process's ranks must share "
        "a node (or be the whole job); use a divisor of {}",
        per_process, node_ranks, node_ranks));
  }
}

}  // namespace zerodp
