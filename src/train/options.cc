// The table of options joined from its parts, and what is derived from it alone: the value
// rules and idle rules run over it, and the report's "config". options.h is the contract.
#include "train/options.h"

#include <stdexcept>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "train/model_kind.h"
#include "train/option_readers.h"

namespace zerodp {

void OptionSpec::refuse(std::string_view value) const {
  throw InvalidArgument(
      fmt::format("{} {} is invalid; {}", flag(), value.empty() ? "''" : value, advice));
}

std::string OptionSpec::value_text(const TrainConfig& c) const {
  if (quote != nullptr) return quote(c);
  return record != nullptr ? quote_value(record(c)) : std::string();
}

std::string quote_value(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "on" : "off";
  if (v.is_number_float()) return fmt::format("{:g}", v.get<double>());
  if (v.is_number()) return v.dump();
  return {};
}

std::span<const OptionSpec> option_table() {
  static const std::vector<OptionSpec> all = [] {
    std::vector<OptionSpec> v;
    for (const std::span<const OptionSpec> part :
         {model_option_table(), parallelism_option_table(), training_option_table(),
          llama_option_table(), island_option_table()}) {
      v.insert(v.end(), part.begin(), part.end());
    }
    return v;
  }();
  return all;
}

const OptionSpec& option_spec(std::string_view key) {
  for (const OptionSpec& o : option_table()) {
    if (o.key == key) return o;
  }
  throw std::logic_error(fmt::format("no option '{}' in the table", key));
}

void check_option_values(const TrainConfig& c, unsigned commands) {
  for (const OptionSpec& o : option_table()) {
    if ((o.commands & commands) != 0 && o.check != nullptr) o.check(c, o);
  }
}

void check_idle_options(const TrainConfig& c, unsigned commands) {
  if (!c.given) return;
  for (const OptionSpec& o : option_table()) {
    if ((o.commands & o.idle_refused_in & commands) == 0 || o.idle == nullptr ||
        c.given->count(std::string(o.key)) == 0) {
      continue;
    }
    if (const std::string_view needs = o.idle(c); !needs.empty()) {
      throw InvalidArgument(fmt::format("{} {} does nothing here: {}, or leave {} out", o.flag(),
                                        o.value_text(c), needs, o.flag()));
    }
  }
}

nlohmann::json config_json(const TrainConfig& c) {
  nlohmann::json j;
  model_kind(c.model).config_fields(c, j);
  for (const OptionSpec& o : option_table()) {
    if (o.record != nullptr) j[std::string(o.key)] = o.record(c);
  }
  // The engine's fixed choice, recorded with the options it completes.
  j["min_lr_ratio"] = c.min_lr_ratio;
  // Idle options as null: a report fed back through --config never gives them.
  for (const OptionSpec& o : option_table()) {
    const std::string key(o.key);
    if (o.idle != nullptr && j.contains(key) && !o.idle(c).empty()) j[key] = nullptr;
  }
  return j;
}

}  // namespace zerodp
