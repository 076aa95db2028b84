// Reading a checkpoint back in tests: every saved state, consolidated.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/store.h"

namespace zerodp::testing {

// Every state of every unit, consolidated from the shards: params in the saved dtype, then
// master (16-bit checkpoints), adam_m and adam_v (8-bit moments: their codes, then each rank's
// block scales and fp32 parts). Equal vectors mean bit-identical states.
inline std::vector<std::vector<std::byte>> checkpoint_states(const std::filesystem::path& dir) {
  const checkpoint::Checkpoint c(checkpoint::resolve(dir));
  std::vector<std::vector<std::byte>> out;
  const size_t psize = c.has_master() ? 2 : 4;
  const bool int8 = c.meta().int8_moments;
  for (size_t u = 0; u < c.meta().units.size(); ++u) {
    const uint64_t n = c.meta().units[u].numel;
    for (const std::string kind : {"params", "master", "adam_m", "adam_v"}) {
      if (kind == "master" && !c.has_master()) continue;
      if (int8 && kind != "params" && kind != "master") {
        std::vector<std::byte> b(n);
        c.read(u, kind + "8", 0, b);
        out.push_back(std::move(b));
        // The scales and fp32 parts, which only each rank's file maps: rank by rank.
        for (const std::string& part : {kind + "8_scale", kind}) {
          for (int r = 0; r < static_cast<int>(c.meta().units[u].counts.size()); ++r) {
            std::vector<std::byte> p(4 * c.length(r, u, part));
            c.read_rank(r, u, part, 0, p);
            out.push_back(std::move(p));
          }
        }
        continue;
      }
      std::vector<std::byte> b(n * (kind == "params" ? psize : 4));
      c.read(u, kind, 0, b);
      out.push_back(std::move(b));
    }
  }
  return out;
}

}  // namespace zerodp::testing
