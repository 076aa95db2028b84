// safetensors, read and written by zerodp's own code (the format of checkpoint shards and of
// `zerodp export`).
//
// A file is: 8 bytes little-endian u64 H, then H bytes of a JSON object (UTF-8, may be
// padded with trailing spaces), then the data section. The object maps each tensor name to
// {"dtype": "F32"|"BF16"|"F16"|..., "shape": [d0, d1, ...], "data_offsets": [begin, end]}
// (byte offsets into the data section, end exclusive); the optional key "__metadata__" maps
// strings to strings. Tensors are row-major, little-endian.
//
// The reader trusts nothing: the header length is bounded (kMaxHeaderBytes and the file's
// size); keys must be unique; every entry must have exactly the three fields with the right
// JSON types; dtype must be one this file knows; shape dimensions non-negative and their
// product times the element size must equal end - begin without overflow; offsets must lie
// inside the data section and no two tensors may overlap. Any violation is CorruptData
// naming the file (the `what` given), the tensor and the expected vs the actual value.
// Holes between tensors are allowed (other writers align), overlaps are not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace zerodp::safetensors {

inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as the reference implementation

// Element types a file may hold. zerodp writes F32, BF16 and F16; the others are
// recognised so that a foreign file is read, not refused.
enum class ElementType : uint8_t { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };
std::string_view element_type_name(ElementType t);  // "F32", "BF16", ...
std::optional<ElementType> parse_element_type(std::string_view name);
size_t element_size(ElementType t);
ElementType element_type_of(DType t);          // kF32, kF16, kBF16
std::optional<DType> dtype_of(ElementType t);  // the three zerodp computes with

struct TensorInfo {
  std::string name;
  ElementType type = ElementType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section, end exclusive
  uint64_t end = 0;
  uint64_t numel() const;  // product of shape (1 for a scalar)
  uint64_t bytes() const { return end - begin; }
};

struct Header {
  std::vector<TensorInfo> tensors;  // in data-offset order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data section: 8 + H
};

// Parses and validates the header of a file of `file_size` bytes whose first bytes are
// `prefix` (at least 8 + H of them, or the whole file when shorter). `what` names the file
// in errors. Throws CorruptData. Allocation is bounded by a small multiple of H.
Header parse_header(std::span<const std::byte> prefix, uint64_t file_size, std::string_view what);

// A tensor to write: name, type and shape; its bytes are streamed later.
struct TensorDecl {
  std::string name;
  ElementType type = ElementType::kF32;
  std::vector<int64_t> shape;
};

// Streams one file: the header is written at construction (every offset is known from the
// declarations), then each tensor's bytes, in declaration order, in as many write() calls
// as the caller likes. finish() checks that every byte was written, fsyncs and closes.
// The sha256 of the whole file is computed on the way, so no second pass reads it back.
// Throws InvalidArgument for bad declarations (duplicate or empty names, a name starting
// with "__"), IoError naming the file on any failed write.
// How a Writer reaches the disk. kDirect bypasses the page cache (O_DIRECT) where the file
// system allows it, through a 1 MiB aligned buffer, the last partial 4 KiB through the cache:
// a checkpoint shard written and fsynced that way costs the kernel a fraction of the CPU (80
// MB with dd on this project's development machine: 0.02-0.03 s of system time and 0.07-0.12
// s in all, against 0.07-0.39 s and 0.13-0.55 s buffered), which a background writer takes
// from the training, and leaves the page cache to the training. Where O_DIRECT is refused
// (tmpfs, a device) it writes as kBuffered. The bytes are the same either way.
enum class WriteMode { kBuffered, kDirect };

// The digest finish() returns: SHA-256 (64 hex digits; exports, which users check with
// sha256sum) or CRC-32C (8 hex digits; checkpoint files, core/crc32c.h says why).
enum class Digest { kSha256, kCrc32c };

// 8 + the length of the header a Writer of `tensors` and `metadata` writes: where the data
// section starts in the file. Throws InvalidArgument as the Writer would.
uint64_t header_bytes(const std::vector<TensorDecl>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

class Writer {
 public:
  Writer(const std::filesystem::path& path, std::vector<TensorDecl> tensors,
         const std::map<std::string, std::string>& metadata = {},
         WriteMode mode = WriteMode::kBuffered, Digest digest = Digest::kSha256);
  ~Writer();  // an unfinished writer closes the file and leaves it (incomplete) in place
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Appends bytes to the current tensor, moving on to the next one when it is full. Writing
  // past the last tensor's end throws InvalidArgument.
  void write(std::span<const std::byte> bytes);
  template <typename T>
  void write_values(std::span<const T> values) {
    write(std::as_bytes(values));
  }
  // The file's size once complete: 8 + header + every tensor's bytes.
  uint64_t file_bytes() const;
  // WriteMode::kDirect: the bytes written so far with O_DIRECT straight from the memory
  // write() was given, not copied into the aligned buffer. That happens to whole blocks of a
  // write whose bytes sit on a 4 KiB boundary in memory where the file reaches one: a caller
  // that places its data at an address congruent to header_bytes() modulo 4 KiB gets all
  // but the first block and the tail written in place.
  uint64_t bytes_in_place() const;
  // 8 + the header's length: the file offset of the first tensor's first byte.
  uint64_t header_bytes() const;
  // Returns the digest of the file as written, in lowercase hex. A device or FIFO (written in
  // place) is not fsynced: it has nothing to make durable.
  std::string finish();

 private:
  struct Impl;
  Impl* impl_;
};

// Reads a file's header at open; tensors are read by element range with pread, so a reader
// of a large file holds only what it asks for. Throws IoError (cannot open or read) or
// CorruptData (see above, and for a path that is not a regular file: a FIFO is opened
// without blocking and refused).
class Reader {
 public:
  explicit Reader(const std::filesystem::path& path);
  ~Reader();
  Reader(Reader&& other) noexcept;
  Reader& operator=(Reader&& other) noexcept;

  const std::filesystem::path& path() const { return path_; }
  const Header& header() const { return header_; }
  uint64_t file_size() const { return file_size_; }
  // nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  // Throws CorruptData naming the file and the tensor when absent, or when its type or
  // shape differ from the expected ones (expected vs actual in the message).
  const TensorInfo& expect(std::string_view name, ElementType type,
                           std::span<const int64_t> shape) const;
  // Elements [first, first + out.size() / element size) of `t` into `out`. Throws
  // InvalidArgument past the tensor's end, IoError on a short read.
  void read(const TensorInfo& t, uint64_t first_element, std::span<std::byte> out) const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  Header header_;
  std::vector<size_t> by_name_;  // indices into header_.tensors, sorted by name, for find()
};

}  // namespace zerodp::safetensors
