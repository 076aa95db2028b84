#include "data/gzip.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/core.h>
#include <zlib.h>

#include "core/error.h"

namespace zerodp {

std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw IoError(fmt::format("{}: not found or not a regular file", path.string()));
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    throw IoError(
        fmt::format("{}: cannot open for reading: {}", path.string(), std::strerror(errno)));
  }
  const std::streamsize size_bytes = in.tellg();
  in.seekg(0);
  std::vector<uint8_t> bytes(static_cast<size_t>(size_bytes));
  if (!in.read(reinterpret_cast<char*>(bytes.data()), size_bytes)) {
    throw IoError(
        fmt::format("{}: read only {} of {} bytes", path.string(), in.gcount(), size_bytes));
  }
  return bytes;
}

namespace {

// Owns a z_stream set up for gzip-only decoding.
class Inflater {
 public:
  explicit Inflater(const std::string& name) {
    // 16 + MAX_WBITS: expect a gzip header and trailer (CRC-32 and length are checked).
    if (inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK) {
      throw IoError(fmt::format("{}: zlib could not initialize: {}", name,
                                zs_.msg ? zs_.msg : "out of memory"));
    }
  }
  ~Inflater() { inflateEnd(&zs_); }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  z_stream& get() { return zs_; }

 private:
  z_stream zs_{};
};

}  // namespace

std::vector<uint8_t> read_gzip_file(const std::filesystem::path& path) {
  const std::string name = path.string();
  const std::vector<uint8_t> packed = read_file_bytes(path);
  if (packed.size() < 2 || packed[0] != 0x1f || packed[1] != 0x8b) {
    throw CorruptData(fmt::format(
        "{}: not a gzip file (starts with {}; gzip files start with 1f 8b); expected the "
        "gzip'd file as shipped, e.g. by the Debian package",
        name,
        packed.size() >= 2 ? fmt::format("{:02x} {:02x}", packed[0], packed[1])
                           : fmt::format("only {} bytes", packed.size())));
  }

  // The trailer's ISIZE is the last member's length mod 2^32: exact for one member under
  // 4 GiB, so the output is usually allocated once. A damaged file's last four bytes are
  // arbitrary, so the hint is only taken when plausible (IDX and text compress well under
  // 64:1); otherwise the buffer grows geometrically.
  size_t expected_bytes = 0;
  if (packed.size() >= 18) {
    const size_t tail = packed.size() - 4;
    const size_t isize = uint32_t{packed[tail]} | (uint32_t{packed[tail + 1]} << 8) |
                         (uint32_t{packed[tail + 2]} << 16) | (uint32_t{packed[tail + 3]} << 24);
    if (isize <= 64 * packed.size()) expected_bytes = isize;
  }
  constexpr size_t kGrowBytes = size_t{1} << 20;
  std::vector<uint8_t> out(std::max<size_t>(expected_bytes, 1));
  size_t out_bytes = 0;  // decompressed so far; out[out_bytes..] is room

  Inflater inflater(name);
  z_stream& zs = inflater.get();
  size_t in_pos = 0;  // next input byte to hand to zlib
  size_t member_count = 1;
  constexpr size_t kMaxChunkBytes = size_t{1} << 30;  // zlib counts in 32-bit uInt
  while (true) {
    if (zs.avail_in == 0 && in_pos < packed.size()) {
      const size_t feed_bytes = std::min(kMaxChunkBytes, packed.size() - in_pos);
      zs.next_in = const_cast<Bytef*>(packed.data() + in_pos);  // zlib's API is not const
      zs.avail_in = static_cast<uInt>(feed_bytes);
      in_pos += feed_bytes;
    }
    if (out_bytes == out.size()) out.resize(out.size() + std::max(kGrowBytes, out.size() / 2));
    const size_t room_bytes = std::min(kMaxChunkBytes, out.size() - out_bytes);
    zs.next_out = out.data() + out_bytes;
    zs.avail_out = static_cast<uInt>(room_bytes);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out_bytes += room_bytes - zs.avail_out;

    if (rc == Z_STREAM_END) {
      const size_t unread_bytes = zs.avail_in + (packed.size() - in_pos);
      if (unread_bytes == 0) break;
      const size_t next = packed.size() - unread_bytes;
      if (unread_bytes >= 2 && packed[next] == 0x1f && packed[next + 1] == 0x8b) {
        ++member_count;
        inflateReset(&zs);
        continue;
      }
      throw CorruptData(fmt::format(
          "{}: {} unexpected bytes after gzip member {} (at byte {} of {}); expected the end "
          "of the file or another gzip member",
          name, unread_bytes, member_count, next, packed.size()));
    }
    // Z_BUF_ERROR with room left means zlib needs input that the file does not have.
    if (rc == Z_OK || (rc == Z_BUF_ERROR && zs.avail_out == 0)) continue;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && in_pos == packed.size()) {
      throw CorruptData(fmt::format(
          "{}: truncated: the gzip stream ends early, after all {} bytes of the file and {} "
          "decompressed bytes; the file is incomplete, fetch or reinstall it",
          name, packed.size(), out_bytes));
    }
    const size_t consumed_bytes = in_pos - zs.avail_in;
    throw CorruptData(fmt::format("{}: corrupt gzip data near compressed byte {} of {}: {}", name,
                                  consumed_bytes, packed.size(), zs.msg ? zs.msg : zError(rc)));
  }
  out.resize(out_bytes);
  return out;
}

}  // namespace zerodp
