// Human quantities on the command line and in reports: bytes ("2GiB", "512MB", "1e9"),
// bandwidths ("1GB/s"), durations ("20us", "1.5s", "300"). Decimal prefixes are powers of
// 1000, binary ones (KiB, MiB, GiB, TiB) powers of 1024.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zerodp {

// Throws InvalidArgument naming `what` and the text when it is not a size.
uint64_t parse_bytes(std::string_view text, std::string_view what = "size");
// Bytes per second; accepts an optional "/s" suffix.
double parse_bandwidth(std::string_view text, std::string_view what = "bandwidth");
// Seconds; a bare number is seconds; suffixes ns, us, ms, s, min.
double parse_seconds(std::string_view text, std::string_view what = "duration");

// "1.50 GiB", "12.0 KiB", "17 B".
std::string format_bytes(double bytes);

}  // namespace zerodp
