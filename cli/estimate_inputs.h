// What `zerodp estimate` reads from its own flags before it plans, and their rules: the
// compute of a step and the disk (the options it shares with train are the table's,
// train/options.h, checked by train/run_check.h). Each throws InvalidArgument naming the
// flag, the value and what would work.
#pragma once

#include <optional>
#include <string>

#include "train/forecast.h"

namespace zerodp::cli {

// A finite number as the whole text, or nullopt.
std::optional<double> parse_number(const std::string& text);

// --disk-bandwidth: R for both directions, or R/W.
DiskBandwidth parse_disk_bandwidth(const std::string& text);

// estimate's own flags that price a step, as given (empty: not given).
struct ForecastText {
  std::string flops, compute_seconds;
  std::string disk_bandwidth, ranks_per_disk;
};
// The compute of a step, the links of `comm` (train's --link-* and --inter-node-* options, 0
// where not given; between nodes the link inside one unless given) and the disk of the
// `offload` file, as the step time forecasts them.
StepInputs parse_forecast(const ForecastText& f, const CommOptions& comm, Offload offload);

}  // namespace zerodp::cli
