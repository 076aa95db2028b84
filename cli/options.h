// train's and estimate's flags, registered from the one table of options (train/options.h):
// a flag's name, help, default shown and parsing are the table's, never restated here.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "train/options.h"

namespace zerodp::cli {

// What CLI11 fills: each option's text as given (our parsers, not CLI11's conversions, read
// them, so -1 is never 2^64 - 1 and messages quote the value).
struct OptionTexts {
  std::map<std::string, std::string> values;
  std::map<std::string, std::vector<std::string>> lists;  // repeatable options
  std::map<std::string, bool> switches;
  std::vector<std::pair<const OptionSpec*, const CLI::Option*>> registered;

  // The text given for `key`, or nullptr.
  const std::string* given(std::string_view key) const;
};

// Registers every option of the table that `command` takes on `app`, under option groups
// named by their sections when `sections`.
void add_table_options(CLI::App& app, Command command, OptionTexts& texts, bool sections);

// Reads every option given into `c`, in the table's order, and returns their keys. Options
// `command` sweeps (estimate's --ranks and --stage) are left to the caller (sweep_values).
std::set<std::string> read_table_options(const OptionTexts& texts, TrainConfig& c, Command command);

// A sweep's comma list, each value read by the option's own reader and rule into a copy of
// `base` and handed to `take`.
void sweep_values(const OptionSpec& spec, const std::string& list, const TrainConfig& base,
                  const std::function<void(const TrainConfig&)>& take);

}  // namespace zerodp::cli
