// libFuzzer target for safetensors::parse_header and checkpoint::parse_meta (`make fuzz`).
//
// An input starting with '{' is also a meta.json candidate: parse_meta must return or throw
// CorruptData naming the file, never anything else (its allocation is the JSON tree's, held
// to libFuzzer's -malloc_limit_mb and -rss_limit_mb, not to the tighter count below).
// The input is a whole file. parse_header must either throw CorruptData naming the file, or
// return a header whose tensors lie inside the data section without overlapping, with sizes
// that match their shapes. While it runs, the bytes it holds on the heap are counted through
// the sanitizer allocator's hooks, and passing kBytesPerInputByte per input byte (plus a
// constant) is a crash: the header promises allocation bounded by a small multiple of H.
#include <sanitizer/allocator_interface.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace {

using zerodp::safetensors::Header;
using zerodp::safetensors::TensorInfo;

constexpr size_t kBytesPerInputByte = 32;
constexpr size_t kConstantBytes = size_t{64} << 10;  // exception objects, small buffers
constexpr std::string_view kWhat = "fuzz-input";

bool counting = false;
size_t live_bytes = 0;
size_t peak_bytes = 0;

void on_malloc(const volatile void*, size_t size) {
  if (!counting) return;
  live_bytes += size;
  peak_bytes = std::max(peak_bytes, live_bytes);
}

void on_free(const volatile void* p) {
  if (!counting || p == nullptr) return;
  // Freed while still allocated, so the allocator still knows its size. Memory from before
  // the call (none is expected) must not take the count below zero.
  live_bytes -= std::min(live_bytes, __sanitizer_get_allocated_size(p));
}

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "safetensors_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check(bool ok, const char* what, const std::string& detail = "") {
  if (!ok) die(what, detail);
}

void check_header(const Header& h, std::span<const std::byte> file) {
  check(file.size() >= 8, "accepted a file shorter than 8 bytes");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | std::to_integer<uint64_t>(file[static_cast<size_t>(i)]);
  }
  check(h.data_start == 8 + header_bytes, "data_start is not 8 + H");
  check(h.data_start <= file.size(), "data section starts past the end of the file");
  const uint64_t data_bytes = file.size() - h.data_start;

  std::vector<std::string_view> names;
  const TensorInfo* previous = nullptr;
  uint64_t furthest_end = 0;
  for (const TensorInfo& t : h.tensors) {
    check(t.name != "__metadata__", "a tensor is named __metadata__");
    check(t.begin <= t.end && t.end <= data_bytes, "tensor outside the data section", t.name);
    uint64_t bytes = zerodp::safetensors::element_size(t.type);
    for (const int64_t d : t.shape) {
      check(d >= 0, "negative dimension", t.name);
      check(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes),
            "shape overflows uint64", t.name);
    }
    check(bytes == t.bytes(), "byte count does not match the shape", t.name);
    check(bytes == t.numel() * zerodp::safetensors::element_size(t.type), "numel disagrees",
          t.name);
    check(zerodp::safetensors::parse_element_type(zerodp::safetensors::element_type_name(t.type)) ==
              t.type,
          "element type name does not round-trip", t.name);
    if (previous != nullptr) {
      check(previous->begin <= t.begin, "tensors not in data-offset order", t.name);
    }
    if (t.begin != t.end) {
      check(t.begin >= furthest_end, "tensors overlap", t.name);
      furthest_end = t.end;
    }
    previous = &t;
    names.push_back(t.name);
  }
  std::sort(names.begin(), names.end());
  check(std::adjacent_find(names.begin(), names.end()) == names.end(), "duplicate tensor names");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (__sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) == 0) {
    die("setup", "cannot install the allocator hooks (build with -fsanitize=address)");
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span file(reinterpret_cast<const std::byte*>(data), size);
  std::optional<Header> header;
  live_bytes = 0;
  peak_bytes = 0;
  counting = true;
  try {
    header.emplace(zerodp::safetensors::parse_header(file, size, kWhat));
  } catch (const zerodp::CorruptData& e) {
    const std::string message = e.what();
    check(message.starts_with(std::string(kWhat) + ": "), "error does not name the file", message);
  }
  counting = false;
  if (peak_bytes > kBytesPerInputByte * size + kConstantBytes) {
    die("allocation not bounded by the input",
        std::to_string(peak_bytes) + " bytes held for a " + std::to_string(size) + "-byte input");
  }
  if (header) check_header(*header, file);
  if (size > 0 && data[0] == '{') {
    try {
      const auto meta = zerodp::checkpoint::parse_meta(
          std::string_view(reinterpret_cast<const char*>(data), size), kWhat);
      check(meta.files.size() == static_cast<size_t>(meta.world_size),
            "meta accepted with a file count unlike its world size");
    } catch (const zerodp::CorruptData& e) {
      const std::string message = e.what();
      check(message.starts_with(std::string(kWhat) + ": "), "meta error does not name the file",
            message);
    }
  }
  return 0;
}
