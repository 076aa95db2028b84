// estimate's rows: one walk over a row's fields gives both the text table (its header and
// its lines) and the JSON row, so a figure cannot be in one and differ in or miss from the
// other. The figures come from the planner (train/forecast.h); this file only names and
// formats them.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "train/config.h"
#include "train/forecast.h"

namespace zerodp::cli {

// Decimal units, as hardware is sold and as the ZeRO paper's tables are written.
std::string gb(uint64_t bytes);

// What decides a row's columns besides the row: the asked run's.
struct RowColumns {
  bool offload = false;  // --offload asked: the nvme column, offload's keys
  bool budget = false;   // --memory-per-rank given: the fits column says yes or no
  bool disk = false;     // --disk-bandwidth given: the io column and the predicted step
};

// The text table's line of the row of `c` (`headers`: its column headers instead).
std::string table_line(const RowColumns& e, const TrainConfig& c, const Forecast& fc, bool fits,
                       bool headers);
// The same row as JSON (docs: estimate --json).
nlohmann::json row_json(const RowColumns& e, const TrainConfig& c, const Forecast& fc, bool fits);

}  // namespace zerodp::cli
