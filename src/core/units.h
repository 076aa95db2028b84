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

// The same, refused (InvalidArgument naming `what`, the value and the range in human units)
// outside [lo, hi]: a value the parser takes is not yet one the program can honour (a
// latency of 1e6 s is a hang; 1e20 B/s prints as 0.00 KB/s).
double parse_bandwidth(std::string_view text, std::string_view what, double lo, double hi);
double parse_seconds(std::string_view text, std::string_view what, double lo, double hi);

// A seed as the user wrote it, every command alike: a whole number 0..2^64-1. Stream
// parsers wrap "-1" into 2^64-1, a different run than the user asked for.
uint64_t parse_seed(std::string_view text, std::string_view what = "--seed");

// "20 us", "1.5 s", "5 min".
std::string format_seconds(double seconds);
// "100 MB/s", "1.25 GB/s" (decimal, as links are sold).
std::string format_bandwidth(double bytes_per_second);

// "1.50 GiB", "12.0 KiB", "17 B".
std::string format_bytes(double bytes);

}  // namespace zerodp
