// What `zerodp estimate` reads from its flags before it plans: the compute of a step, the
// simulated link (train's ranges, so an estimate never prices a link train would refuse) and
// the disk. Each throws InvalidArgument naming the flag, the value and what would work.
#pragma once

#include <optional>
#include <string>

#include "train/forecast.h"

namespace zerodp::cli {

// A finite number as the whole text, or nullopt.
std::optional<double> parse_number(const std::string& text);

// --disk-bandwidth: R for both directions, or R/W.
DiskBandwidth parse_disk_bandwidth(const std::string& text);

// The flags as given (empty: not given).
struct ForecastText {
  std::string flops, compute_seconds, link_bandwidth, link_latency, inter_node_bandwidth,
      inter_node_latency;
  int node_ranks = 0;
};
// --flops or --compute-seconds, and the simulated link, as the step time forecasts them (the
// disk is the caller's).
StepInputs parse_forecast(const ForecastText& f);

}  // namespace zerodp::cli
