// What `zerodp estimate` reads from its own flags before it plans: the compute of a step and
// the disk (the options it shares with train are the table's, train/options.h). Each throws
// InvalidArgument naming the flag, the value and what would work.
#pragma once

#include <optional>
#include <string>

#include "train/forecast.h"

namespace zerodp::cli {

// A finite number as the whole text, or nullopt.
std::optional<double> parse_number(const std::string& text);

// --disk-bandwidth: R for both directions, or R/W.
DiskBandwidth parse_disk_bandwidth(const std::string& text);

// --flops and --compute-seconds as given (empty: not given).
struct ForecastText {
  std::string flops, compute_seconds;
};
// The compute of a step and the links of `comm` (train's --link-* and --inter-node-* options,
// 0 where not given; between nodes the link inside one unless given), as the step time
// forecasts them (the disk is the caller's).
StepInputs parse_forecast(const ForecastText& f, const CommOptions& comm);

}  // namespace zerodp::cli
