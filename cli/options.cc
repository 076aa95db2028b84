// options.h is the contract.
#include "options.h"

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp::cli {

const std::string* OptionTexts::given(std::string_view key) const {
  for (const auto& [spec, option] : registered) {
    if (spec->key == key && option->count() > 0) return &values.at(std::string(key));
  }
  return nullptr;
}

namespace {

// The default --help shows: the table's words, or what a default configuration records.
std::string shown_default(const OptionSpec& o, const TrainConfig& defaults) {
  if (!o.shown.empty()) return o.shown == "-" ? std::string() : std::string(o.shown);
  if (o.record == nullptr || o.form != OptionSpec::Form::kValue) return {};
  return quote_value(o.record(defaults));
}

std::string type_word(const OptionSpec& o, const TrainConfig& defaults) {
  if (!o.type.empty()) return std::string(o.type);
  if (o.record == nullptr) return "TEXT";
  const nlohmann::json v = o.record(defaults);
  if (v.is_boolean()) return "BOOLEAN";
  if (v.is_number_float()) return "NUMBER";
  if (v.is_number()) return "INT";
  return "TEXT";
}

}  // namespace

void add_table_options(CLI::App& app, Command command, OptionTexts& texts, bool sections) {
  std::map<std::string_view, CLI::Option_group*> groups;
  static const TrainConfig defaults;
  for (const OptionSpec& o : option_table()) {
    if ((o.commands & command) == 0) continue;
    CLI::App* on = &app;
    if (sections) {
      auto [it, fresh] = groups.try_emplace(o.section, nullptr);
      if (fresh) it->second = app.add_option_group(std::string(o.section));
      on = it->second;
    }
    const std::string key(o.key), flag = o.flag(), help(o.help);
    CLI::Option* option = nullptr;
    switch (o.form) {
      case OptionSpec::Form::kSwitch:
        option = on->add_flag(flag, texts.switches[key], help);
        break;
      case OptionSpec::Form::kRepeated:
        option = on->add_option(flag, texts.lists[key], help)
                     ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
        break;
      case OptionSpec::Form::kValue:
        option = on->add_option(flag, texts.values[key], help)
                     ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
        if (const std::string d = shown_default(o, defaults); !d.empty()) option->default_str(d);
        break;
    }
    if (o.form != OptionSpec::Form::kSwitch) option->type_name(type_word(o, defaults));
    texts.registered.emplace_back(&o, option);
  }
}

std::set<std::string> read_table_options(const OptionTexts& texts, TrainConfig& c,
                                         Command command) {
  std::set<std::string> given;
  for (const auto& [spec, option] : texts.registered) {
    if (option->count() == 0) continue;
    const std::string key(spec->key);
    given.insert(key);
    if (spec->sweeps && command == kEstimateCommand) continue;
    switch (spec->form) {
      case OptionSpec::Form::kSwitch:
        if (texts.switches.at(key)) spec->read(c, "true", *spec);
        break;
      case OptionSpec::Form::kRepeated:
        for (const std::string& text : texts.lists.at(key)) spec->read(c, text, *spec);
        break;
      case OptionSpec::Form::kValue:
        spec->read(c, texts.values.at(key), *spec);
        break;
    }
  }
  return given;
}

void sweep_values(const OptionSpec& spec, const std::string& list, const TrainConfig& base,
                  const std::function<void(const TrainConfig&)>& take) {
  size_t from = 0;
  while (true) {
    const size_t comma = list.find(',', from);
    TrainConfig c = base;
    spec.read(c, list.substr(from, comma == std::string::npos ? comma : comma - from), spec);
    if (spec.check != nullptr) spec.check(c, spec);
    take(c);
    if (comma == std::string::npos) return;
    from = comma + 1;
  }
}

}  // namespace zerodp::cli
