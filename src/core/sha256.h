// SHA-256 (FIPS 180-4): incremental hashing and hex digests.
//
// Used for the KJV cache check, and meant for reports (`weights_sha256`,
// `samples_sha256`) and checkpoints. A Sha256 is a plain value: copy it to fork a running
// hash; digest() does not change it, so a caller may take digests of a prefix and keep
// feeding. Not thread-safe; use one per thread. Blocks are compressed with the x86 SHA
// extensions where the CPU has them (4.7x the portable code, bench_sha256; checkpoints hash
// every byte they write and read), else by the portable FIPS 180-4 rounds; same digests.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace zerodp {

class Sha256 {
 public:
  static constexpr size_t kDigestBytes = 32;
  using Digest = std::array<uint8_t, kDigestBytes>;

  Sha256();

  void update(std::span<const std::byte> data);
  void update(std::string_view data) { update(std::as_bytes(std::span(data))); }
  void update(const void* data, size_t size_bytes) {
    update(std::span(static_cast<const std::byte*>(data), size_bytes));
  }

  // The digest of everything fed so far; the hash stays open for more updates.
  Digest digest() const;
  // digest() as 64 lowercase hex characters.
  std::string hex_digest() const;

  // Bytes fed so far.
  uint64_t size_bytes() const { return total_bytes_; }

 private:
  void compress(const uint8_t* blocks, size_t count);  // 64-byte blocks into state_

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};  // a partial block, buffered_bytes_ of it valid
  size_t buffered_bytes_ = 0;
  uint64_t total_bytes_ = 0;
};

// One-shot helpers.
std::string sha256_hex(std::span<const std::byte> data);
std::string sha256_hex(std::string_view data);
// Hashes a whole file in 1 MiB reads. Throws IoError naming the file when it cannot be read.
std::string sha256_file_hex(const std::filesystem::path& path);

// Feeds each value as 8 little-endian bytes, whatever the host byte order (the report's
// `samples_sha256` hashes sample indices this way).
void sha256_update_u64_le(Sha256& hash, std::span<const uint64_t> values);

namespace sha256_detail {
// The two block compressions behind Sha256, exposed so tests can compare them.
bool cpu_has_sha_extensions();
void compress_portable(std::array<uint32_t, 8>& state, const uint8_t* blocks, size_t count);
// Only where cpu_has_sha_extensions().
void compress_sha_extensions(std::array<uint32_t, 8>& state, const uint8_t* blocks, size_t count);
}  // namespace sha256_detail

// Lowercase hex of bytes ("" for none).
std::string to_hex(std::span<const uint8_t> bytes);

}  // namespace zerodp
