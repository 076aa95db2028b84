#include <fstream>
#include <sstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"

namespace zerodp::cli {

std::vector<std::string> expand_config_file(int argc, char** argv) {
  std::vector<std::string> in(argv + 1, argv + argc);
  std::vector<std::string> out;
  std::string path;
  size_t at = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == "--config" && i + 1 < in.size()) {
      path = in[i + 1];
      at = i;
      in.erase(in.begin() + static_cast<std::ptrdiff_t>(i),
               in.begin() + static_cast<std::ptrdiff_t>(i + 2));
      break;
    }
    if (in[i].rfind("--config=", 0) == 0) {
      path = in[i].substr(9);
      at = i;
      in.erase(in.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  if (path.empty()) return in;
  std::ifstream f(path);
  if (!f) throw InvalidArgument(fmt::format("--config: cannot read '{}'", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("--config '{}' is not valid JSON: {}", path, e.what()));
  }
  if (!j.is_object()) {
    throw InvalidArgument(fmt::format(
        "--config '{}' must hold a JSON object of flag names to values, e.g. {{\"stage\": 3}}",
        path));
  }
  std::vector<std::string> flags;
  for (const auto& [key, value] : j.items()) {
    const std::string flag = "--" + key;
    if (value.is_boolean()) {
      if (value.get<bool>()) flags.push_back(flag);
    } else if (value.is_string()) {
      flags.push_back(flag + "=" + value.get<std::string>());
    } else if (value.is_number()) {
      flags.push_back(flag + "=" + value.dump());
    } else {
      throw InvalidArgument(
          fmt::format("--config '{}': key '{}' must be a string, number or boolean", path, key));
    }
  }
  in.insert(in.begin() + static_cast<std::ptrdiff_t>(at), flags.begin(), flags.end());
  return in;
}

}  // namespace zerodp::cli
