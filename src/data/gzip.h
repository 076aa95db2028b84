// Whole-file gzip (RFC 1952) decompression over zlib.
//
// Strict by design: a file that is not gzip is an error, not passed through as plain
// bytes (zlib's gzread would do that and turn "wrong file" into a confusing later error).
// Concatenated gzip members are decompressed in order, as gunzip does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace zerodp {

// The decompressed content of a gzip file. Throws IoError when the file cannot be read and
// CorruptData naming the file when it is not gzip, is truncated, fails its CRC, or has
// trailing bytes that are not another gzip member.
std::vector<uint8_t> read_gzip_file(const std::filesystem::path& path);

// Reads a whole file. Throws IoError naming it when it is missing or unreadable.
std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path);

}  // namespace zerodp
