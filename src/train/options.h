// Every option of a run, declared once: its key, its section and help, the commands that take
// it, how its text becomes a TrainConfig field, the rule its value must keep, when it has
// nothing to act on, and how the field is recorded. train's and estimate's flags
// (cli/options.h registers them), the keys of a --config file, the report's "config"
// (config_json) and the comparison of the MPI ranks' configurations (check_same_options
// digests config_json) are all derived from this table; the rules between options and
// between them and the world live in run_check.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "train/config.h"

namespace zerodp {

// The commands that take an option (bits).
enum Command : unsigned { kTrainCommand = 1, kEstimateCommand = 2 };

struct OptionSpec {
  // config_json's key; the flag is --key with '-' for '_' (flag_of).
  std::string_view key;
  std::string_view section;  // train's --help groups options under it
  std::string_view help;
  unsigned commands = kTrainCommand;
  enum class Form { kValue, kSwitch, kRepeated } form = Form::kValue;
  // estimate sweeps it: a comma list of values (--ranks 1,8,64), each read on its own.
  bool sweeps = false;
  // What a refused value is told to be instead ("use 1 or more").
  std::string_view advice = {};
  // --help's word for the value (INT, NUMBER, SIZE, ...); empty: from record()'s JSON type
  // (BOOLEAN for an on/off, which a --config file may give as true or false), else TEXT.
  std::string_view type = {};
  // --help's default: empty shows record() of a default configuration, "-" shows none.
  std::string_view shown = {};
  // The text given (a switch reads "true") into `c`; throws InvalidArgument naming the flag,
  // the text and what would work.
  void (*read)(TrainConfig& c, const std::string& text, const OptionSpec& self) = nullptr;
  // The rule the value keeps, whatever set it (the command line or code): resolve_config runs
  // every option's. nullptr: any value it can hold is valid.
  void (*check)(const TrainConfig& c, const OptionSpec& self) = nullptr;
  // The value config_json records; nullptr: not part of the run's configuration (where this
  // rank writes its outputs, how it shows progress) or recorded by the model kind (shapes).
  nlohmann::json (*record)(const TrainConfig& c) = nullptr;
  // An option that acts only in some combinations: what would give it something to act on
  // while it has nothing ("it sizes --qwz's blocks, and --qwz is off; add --qwz"), empty
  // while it acts. Given explicitly (TrainConfig::given), it is refused ("--qwz-block 64 does
  // nothing here: NEEDS, or leave --qwz-block out"); config_json records it as null, so a
  // report fed back through --config never gives it. nullptr: it always acts.
  std::string_view (*idle)(const TrainConfig& c) = nullptr;
  // The commands that refuse it idle. estimate has no --checkpoint-dir, and its --ranks are
  // rows: an option idle for want of those is train's to refuse.
  unsigned idle_refused_in = kTrainCommand | kEstimateCommand;
  // How a message quotes the value; nullptr: as record() writes it (quote_value).
  std::string (*quote)(const TrainConfig& c) = nullptr;

  std::string flag() const { return flag_of(key); }
  // Throws InvalidArgument "--flag VALUE is invalid; ADVICE".
  [[noreturn]] void refuse(std::string_view value) const;
  // The value `c` holds, as messages quote it.
  std::string value_text(const TrainConfig& c) const;
};

// A recorded value as a person reads it: text as is, a boolean as on or off, a fraction in
// %g, a whole number in full; null as nothing.
std::string quote_value(const nlohmann::json& v);

std::span<const OptionSpec> option_table();
// The entry of `key`; throws std::logic_error for a key the table lacks.
const OptionSpec& option_spec(std::string_view key);

// Runs every option's own rule that `commands` take (check); check_run calls it.
void check_option_values(const TrainConfig& c, unsigned commands = kTrainCommand);
// Refuses the first option `commands` take and refuse idle that was given (TrainConfig::given)
// and has nothing to act on (idle); check_run calls it. A configuration built in code has
// nothing given, so library callers keep their defaults.
void check_idle_options(const TrainConfig& c, unsigned commands = kTrainCommand);

}  // namespace zerodp
