// estimate_inputs.h is the contract.
#include "estimate_inputs.h"

#include <cmath>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "core/units.h"
#include "train/config.h"

namespace zerodp::cli {

// `text` whole as a finite number (7.5e9, 124000000, 0.5); nullopt for anything else,
// trailing characters included.
std::optional<double> parse_number(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// --disk-bandwidth: one bandwidth for both directions, or read/write. A bandwidth may end in
// "/s" itself, so the text splits at the one '/' whose two sides are both bandwidths
// ("2.1GB/s/1.0GB/s", "2138e6/1031e6"); "2.1GB/s" alone is one figure. Each figure must lie
// in train's kDiskBandwidthRange: past it the io column rounds to nothing (1e20 B/s printed
// as 0.00 KB/s) or describes no disk.
DiskBandwidth parse_disk_bandwidth(const std::string& text) {
  const auto one = [](std::string_view part) -> std::optional<double> {
    try {
      const double v = parse_bandwidth(part, "--disk-bandwidth");
      if (std::isfinite(v)) return v;
    } catch (const InvalidArgument&) {
    }
    return std::nullopt;
  };
  struct Reading {
    double read = 0, write = 0;
    std::string read_text, write_text;  // as given, for the range check's message
  };
  std::vector<Reading> readings;
  if (const auto both = one(text)) readings.push_back({*both, *both, text, text});
  for (size_t at = text.find('/'); at != std::string::npos; at = text.find('/', at + 1)) {
    const std::string read_text = text.substr(0, at), write_text = text.substr(at + 1);
    const auto r = one(read_text);
    const auto w = one(write_text);
    if (r && w) readings.push_back({*r, *w, read_text, write_text});
  }
  if (readings.size() != 1) {
    throw InvalidArgument(fmt::format(
        "--disk-bandwidth '{}' is not a disk's bandwidth; give bytes per second for reads and "
        "writes alike or as READ/WRITE, e.g. 2GB/s, 2.1GB/s/1.0GB/s or 2138e6/1031e6 (zerodp "
        "bench-io DIR measures them)",
        text));
  }
  const Reading& d = readings[0];
  const bool pair = d.read_text != text;
  (void)parse_bandwidth(d.read_text, pair ? "--disk-bandwidth READ" : "--disk-bandwidth",
                        kDiskBandwidthRange.min, kDiskBandwidthRange.max);
  if (pair) {
    (void)parse_bandwidth(d.write_text, "--disk-bandwidth WRITE", kDiskBandwidthRange.min,
                          kDiskBandwidthRange.max);
  }
  return {.read = d.read, .write = d.write};
}

namespace {

// --disk-bandwidth prices the offload file; --ranks-per-disk shares that bandwidth.
void parse_disk(const ForecastText& f, Offload offload, StepInputs& in) {
  if (!f.disk_bandwidth.empty()) {
    if (offload == Offload::kNone) {
      throw InvalidArgument(fmt::format(
          "--disk-bandwidth {} prices the offload file's reads and writes; give --offload "
          "optimizer with it (or leave it out)",
          f.disk_bandwidth));
    }
    in.disk = parse_disk_bandwidth(f.disk_bandwidth);
  }
  if (f.ranks_per_disk.empty()) return;
  if (!in.disk) {
    throw InvalidArgument(fmt::format(
        "--ranks-per-disk {} divides a disk's bandwidth among ranks; give --offload optimizer "
        "and --disk-bandwidth with it",
        f.ranks_per_disk));
  }
  const double k = parse_number(f.ranks_per_disk).value_or(0);
  if (!(k >= 1) || k > 1e6 || k != std::floor(k)) {
    throw InvalidArgument(
        fmt::format("--ranks-per-disk '{}' is not a rank count; use a whole number, 1 or more",
                    f.ranks_per_disk));
  }
  in.ranks_per_disk = static_cast<int>(k);
}

}  // namespace

StepInputs parse_forecast(const ForecastText& f, const CommOptions& comm, Offload offload) {
  StepInputs in;
  if (!f.flops.empty()) {
    in.flops = parse_number(f.flops);
    if (!in.flops || !(*in.flops > 0)) {
      throw InvalidArgument(fmt::format(
          "--flops '{}' is not a rate; give a positive, finite FLOP/s per rank, e.g. 365e9 "
          "(zerodp bench-gemm)",
          f.flops));
    }
  }
  if (!f.compute_seconds.empty()) {
    if (in.flops) {
      throw InvalidArgument(
          "--flops and --compute-seconds both give the compute of a step; give one of them");
    }
    in.compute_seconds = parse_seconds(f.compute_seconds, "--compute-seconds", 1e-6, 86400);
  }
  const auto given = [](double v) { return v > 0 ? std::optional<double>(v) : std::nullopt; };
  in.bandwidth = given(comm.link_bandwidth);
  in.latency = given(comm.link_latency);
  in.inter_bandwidth =
      comm.inter_node_bandwidth > 0 ? given(comm.inter_node_bandwidth) : in.bandwidth;
  in.inter_latency = comm.inter_node_latency > 0 ? given(comm.inter_node_latency) : in.latency;
  parse_disk(f, offload, in);
  return in;
}

}  // namespace zerodp::cli
