#include <fstream>
#include <sstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/files.h"

namespace zerodp::cli {
namespace {

// Keys of a report's "config" that no flag sets: the engine's fixed choices, recorded so a
// reader knows them. Re-running from a report skips them.
bool is_recorded_only(const std::string& key) { return key == "min_lr_ratio"; }

// The subcommand the command line runs (its first word naming one), or null.
const CLI::App* subcommand_of(const CLI::App& app, const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a.starts_with("-")) continue;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      if (sub->get_name() == a) return sub;
    }
    return nullptr;
  }
  return nullptr;
}

// Searches the subcommand's option groups too.
const CLI::Option* find_option(const CLI::App& sub, const std::string& flag) {
  return sub.get_option_no_throw(flag);
}

}  // namespace

std::vector<std::string> expand_config_file(int argc, char** argv, const CLI::App& app) {
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
  // A directory would fail deep inside the stream library, a FIFO would block forever.
  files::require_regular_input("--config", path);
  std::ifstream f(path);
  if (!f) throw InvalidArgument(fmt::format("--config: cannot read '{}'", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("--config '{}' is not valid JSON: {}", path, e.what()));
  }
  // A run's report holds its resolved options under "config": a run is re-runnable from it.
  const bool report = j.is_object() && j.contains("zerodp_version") && j.contains("config");
  if (report) j = j["config"];
  if (!j.is_object()) {
    throw InvalidArgument(fmt::format(
        "--config '{}' must hold a JSON object of flag names to values, e.g. {{\"stage\": 3}}",
        path));
  }
  const CLI::App* sub = subcommand_of(app, in);
  std::vector<std::string> flags;
  for (const auto& [raw_key, value] : j.items()) {
    std::string key = raw_key;
    for (char& ch : key) ch = ch == '_' ? '-' : ch;
    const std::string flag = "--" + key;
    const CLI::Option* option = sub != nullptr ? find_option(*sub, flag) : nullptr;
    if (sub != nullptr && option == nullptr) {
      if (report && is_recorded_only(raw_key)) continue;
      throw InvalidArgument(fmt::format(
          "--config '{}': key '{}' is not an option of zerodp {}; keys are its flags without "
          "--, e.g. \"stage\" (see zerodp {} --help)",
          path, raw_key, sub->get_name(), sub->get_name()));
    }
    const bool is_flag = option != nullptr && option->get_expected_max() == 0;
    if (value.is_null()) {
      if (report) continue;  // a report's unset option: the default
      throw InvalidArgument(fmt::format(
          "--config '{}': key '{}' is null; give it a value or leave it out", path, raw_key));
    }
    if (value.is_boolean()) {
      if (is_flag) {
        if (value.get<bool>()) flags.push_back(flag);
      } else if (option != nullptr && option->get_type_name() != "BOOLEAN") {
        throw InvalidArgument(fmt::format(
            "--config '{}': key '{}' is {}, but {} takes a value ({}), e.g. {{\"{}\": ...}}", path,
            raw_key, value.dump(), flag, option->get_type_name(), raw_key));
      } else {
        flags.push_back(flag + "=" + (value.get<bool>() ? "true" : "false"));
      }
    } else if (is_flag) {
      throw InvalidArgument(
          fmt::format("--config '{}': key '{}' is a switch; give it true or false, not {}", path,
                      raw_key, value.dump()));
    } else if (value.is_string()) {
      const std::string text = value.get<std::string>();
      if (report && text.empty()) continue;  // a report's unset path
      flags.push_back(flag + "=" + text);
    } else if (value.is_number()) {
      flags.push_back(flag + "=" + value.dump());
    } else if (value.is_array() && option != nullptr && option->get_expected_max() > 1) {
      for (const auto& v : value) {
        flags.push_back(flag + "=" + (v.is_string() ? v.get<std::string>() : v.dump()));
      }
    } else {
      throw InvalidArgument(fmt::format(
          "--config '{}': key '{}' must be a string, number or boolean", path, raw_key));
    }
  }
  in.insert(in.begin() + static_cast<std::ptrdiff_t>(at), flags.begin(), flags.end());
  return in;
}

}  // namespace zerodp::cli
