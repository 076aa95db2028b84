// The run report (docs/report.md is its contract) and the end-of-run summary table.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "train/result.h"

namespace zerodp {

nlohmann::json step_json(const StepRecord& s);
nlohmann::json report_json(const TrainResult& r);

// Per-rank memory by category and comm bytes per step, for a terminal.
std::string summary_table(const TrainResult& r);
// Per rank: model-state bytes and comm bytes per step, measured next to the formula.
std::string formula_table(const TrainResult& r);

}  // namespace zerodp
