// CRC-32C (Castagnoli; the iSCSI, ext4-metadata and zarr v3 checksum, RFC 3720 appendix B.4):
// the digest of every file a checkpoint writes.
//
// Why not SHA-256, which checkpoints used before: a digest here guards against a file that was
// torn, truncated, bit-rotted or swapped for another, not against an adversary who can also
// rewrite meta.json beside it. For that a 32-bit CRC suffices (every error burst up to 32 bits
// is caught, any other with probability 1 - 2^-32, and the size is checked as well), and the
// SSE4.2 crc32 instruction computes it at 9.3-9.6 GB/s on one core, where SHA-256 with the SHA
// extensions makes 1.15 GB/s: a medium shard's digest 66 ms -> 8 ms of the writer's CPU, which
// comes out of a rank's core whenever every core runs one. Exports keep SHA-256: their digest
// names a file for a user, who may check it with sha256sum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace zerodp {

class Crc32c {
 public:
  void update(std::span<const std::byte> data);
  void update(const void* data, size_t size_bytes) {
    update(std::span(static_cast<const std::byte*>(data), size_bytes));
  }
  // The CRC of everything fed so far; the hash stays open for more.
  uint32_t value() const { return ~state_; }
  // value() as 8 lowercase hex digits, most significant first.
  std::string hex() const;

 private:
  uint32_t state_ = 0xFFFFFFFFu;
};

uint32_t crc32c(std::span<const std::byte> data);
// Hashes a whole file in 1 MiB reads. Throws IoError naming the file when it cannot be read.
std::string crc32c_file_hex(const std::filesystem::path& path);

namespace crc32c_detail {
// The two ways Crc32c::update runs, exposed so tests can compare them: a table per byte, and
// the SSE4.2 instruction (only where cpu_has_sse42()). Both take and return the running state
// (the CRC's complement).
bool cpu_has_sse42();
uint32_t update_portable(uint32_t state, const uint8_t* data, size_t size);
uint32_t update_sse42(uint32_t state, const uint8_t* data, size_t size);
}  // namespace crc32c_detail

}  // namespace zerodp
