// world_shape.h is the contract.
#include "comm/world_shape.h"

#include <string>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {

void check_divides_world(std::string_view flag, int by, int world, std::string_view why,
                         WorldNamed named, bool zero_is_whole) {
  if (by > 0 ? world % by == 0 : by == 0 && zero_is_whole) return;
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
  check_divides_world("--node-ranks", node_ranks, world, "a world is whole nodes", named,
                      /*zero_is_whole=*/true);
}

}  // namespace zerodp
