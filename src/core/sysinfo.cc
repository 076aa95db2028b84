#include "core/sysinfo.h"

#include <fstream>
#include <string>

namespace zerodp {

std::optional<uint64_t> available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace zerodp
