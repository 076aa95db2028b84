#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <set>
#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_text.h"
#include "core/error.h"
#include "core/sha256.h"

namespace zerodp::safetensors {
namespace {

using detail::checked_bytes;
using detail::json_quoted;
using detail::shape_text;

struct TypeInfo {
  std::string_view name;
  size_t size;
};
// Indexed by ElementType.
constexpr std::array<TypeInfo, 10> kTypes = {{{"F64", 8},
                                              {"F32", 4},
                                              {"F16", 2},
                                              {"BF16", 2},
                                              {"I64", 8},
                                              {"I32", 4},
                                              {"I16", 2},
                                              {"I8", 1},
                                              {"U8", 1},
                                              {"BOOL", 1}}};
static_assert(static_cast<size_t>(ElementType::kBool) + 1 == kTypes.size());

const TypeInfo& type_info(ElementType t) {
  const auto i = static_cast<size_t>(t);
  if (i >= kTypes.size()) {
    throw InvalidArgument(
        fmt::format("safetensors: element type {} is not one of the {} known", i, kTypes.size()));
  }
  return kTypes[i];
}

std::string known_types() {
  std::string out;
  for (const TypeInfo& t : kTypes) {
    if (!out.empty()) out += ", ";
    out += t.name;
  }
  return out;
}

uint64_t load_le64(std::span<const std::byte> b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<uint64_t>(b[static_cast<size_t>(i)]);
  return v;
}

// Builds the Header straight from parser events, so nothing but the result is allocated
// (a DOM of hostile JSON can cost tens of bytes per input byte), every object level sees its
// duplicate keys (a DOM keeps only the last), and the first wrong event names its place.
class HeaderSax final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit HeaderSax(std::string_view what) : what_(what) {}

  Header take() { return std::move(header_); }

  bool null() override { return value("null"); }
  bool boolean(bool) override { return value("a boolean"); }
  bool number_integer(number_integer_t v) override {
    // The lexer reports non-negative integers as unsigned, so this is a negative one (or -0).
    if (v >= 0) return number_unsigned(static_cast<uint64_t>(v));
    if (state_ == State::kShape) {
      fail_tensor(fmt::format("shape has the negative dimension {}", v));
    }
    if (state_ == State::kOffsets) {
      fail_tensor(fmt::format("data_offsets holds the negative offset {}", v));
    }
    return value("a negative integer");
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (state_ == State::kShape) {
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail_tensor(fmt::format("shape has the dimension {}, past the largest int64", v));
      }
      tensor().shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (state_ == State::kOffsets) {
      if (offsets_seen_ == 2)
        fail_tensor("data_offsets holds more than 2 values, expected [begin, end]");
      (offsets_seen_ == 0 ? tensor().begin : tensor().end) = v;
      ++offsets_seen_;
      return true;
    }
    return value("an integer");
  }
  bool number_float(number_float_t, const string_t& text) override {
    // Integers past 2^64 arrive here too; either way no field takes one.
    return value(fmt::format("the number {}", text));
  }
  bool string(string_t& s) override {
    if (state_ == State::kField && field_ == Field::kDtype) {
      const auto t = parse_element_type(s);
      if (!t) {
        fail_tensor(
            fmt::format("unknown dtype {}; this reader knows {}", json_quoted(s), known_types()));
      }
      tensor().type = *t;
      state_ = State::kEntry;
      return true;
    }
    if (state_ == State::kMetadataValue) {
      if (!header_.metadata.try_emplace(std::move(metadata_key_), std::move(s)).second) {
        fail(fmt::format("__metadata__ key {} appears twice", json_quoted(metadata_key_)));
      }
      state_ = State::kMetadata;
      return true;
    }
    return value("a string");
  }
  bool binary(binary_t&) override { return value("binary data"); }

  bool start_object(std::size_t) override {
    switch (state_) {
      case State::kStart:
        state_ = State::kTop;
        return true;
      case State::kTopValue:
        if (in_metadata_) {
          state_ = State::kMetadata;
        } else {
          seen_fields_ = 0;
          state_ = State::kEntry;
        }
        return true;
      default:
        return value("an object");
    }
  }
  bool key(string_t& k) override {
    switch (state_) {
      case State::kTop:
        in_metadata_ = k == "__metadata__";
        if (in_metadata_) {
          if (seen_metadata_) fail("\"__metadata__\" appears twice");
          seen_metadata_ = true;
        } else {
          header_.tensors.emplace_back().name = std::move(k);
        }
        state_ = State::kTopValue;
        return true;
      case State::kMetadata:
        metadata_key_ = std::move(k);
        state_ = State::kMetadataValue;
        return true;
      case State::kEntry: {
        if (k == "dtype") {
          field_ = Field::kDtype;
        } else if (k == "shape") {
          field_ = Field::kShape;
        } else if (k == "data_offsets") {
          field_ = Field::kOffsets;
        } else {
          fail_tensor(
              fmt::format("unknown field {}; an entry has exactly dtype, shape and "
                          "data_offsets",
                          json_quoted(k)));
        }
        const unsigned bit = 1u << static_cast<unsigned>(field_);
        if (seen_fields_ & bit) fail_tensor(fmt::format("field \"{}\" appears twice", k));
        seen_fields_ |= bit;
        state_ = State::kField;
        return true;
      }
      default:  // keys only occur in objects, and every other object is refused at its start
        fail("unexpected object key");
    }
  }
  bool end_object() override {
    switch (state_) {
      case State::kTop:
        state_ = State::kDone;
        return true;
      case State::kMetadata:
        state_ = State::kTop;
        return true;
      case State::kEntry:
        for (const Field f : {Field::kDtype, Field::kShape, Field::kOffsets}) {
          if (!(seen_fields_ & (1u << static_cast<unsigned>(f)))) {
            fail_tensor(
                fmt::format("missing field \"{}\"; an entry has dtype, shape and "
                            "data_offsets",
                            field_name(f)));
          }
        }
        state_ = State::kTop;
        return true;
      default:
        fail("unexpected end of object");
    }
  }
  bool start_array(std::size_t) override {
    if (state_ == State::kField && field_ == Field::kShape) {
      state_ = State::kShape;
      return true;
    }
    if (state_ == State::kField && field_ == Field::kOffsets) {
      offsets_seen_ = 0;
      state_ = State::kOffsets;
      return true;
    }
    return value("an array");
  }
  bool end_array() override {
    if (state_ == State::kOffsets && offsets_seen_ != 2) {
      fail_tensor(fmt::format("data_offsets holds {} value{}, expected [begin, end]", offsets_seen_,
                              offsets_seen_ == 1 ? "" : "s"));
    }
    if (state_ == State::kShape || state_ == State::kOffsets) {
      state_ = State::kEntry;
      return true;
    }
    fail("unexpected end of array");
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    // nlohmann quotes the token it stopped in, which may be most of the header.
    std::string reason = e.what();
    constexpr size_t kMaxReason = 200;
    if (reason.size() > kMaxReason) reason = reason.substr(0, kMaxReason) + "...";
    fail(fmt::format("header is not valid JSON: {}", reason));
  }

 private:
  enum class State {
    kStart,          // before the top-level value
    kTop,            // in the top-level object, before a key or its end
    kTopValue,       // after a top-level key
    kMetadata,       // in __metadata__, before a key or its end
    kMetadataValue,  // after a __metadata__ key
    kEntry,          // in a tensor's entry, before a field or its end
    kField,          // after a field name
    kShape,          // in the shape array
    kOffsets,        // in the data_offsets array
    kDone,
  };
  enum class Field : unsigned { kDtype, kShape, kOffsets };

  static std::string_view field_name(Field f) {
    switch (f) {
      case Field::kDtype:
        return "dtype";
      case Field::kShape:
        return "shape";
      case Field::kOffsets:
        return "data_offsets";
    }
    return "?";
  }

  TensorInfo& tensor() { return header_.tensors.back(); }

  [[noreturn]] void fail(const std::string& message) const {
    throw CorruptData(fmt::format("{}: {}", what_, message));
  }
  [[noreturn]] void fail_tensor(const std::string& message) {
    fail(fmt::format("tensor {}: {}", json_quoted(tensor().name), message));
  }

  // A value event that the state does not take: say what was found where.
  [[noreturn]] bool value(const std::string& found) {
    switch (state_) {
      case State::kStart:
        fail(fmt::format("header is {}, expected a JSON object", found));
      case State::kTopValue:
        if (in_metadata_) {
          fail(fmt::format("\"__metadata__\" is {}, expected an object of strings", found));
        }
        fail_tensor(
            fmt::format("entry is {}, expected an object with dtype, shape and "
                        "data_offsets",
                        found));
      case State::kMetadataValue:
        fail(fmt::format("__metadata__ value of {} is {}, expected a string",
                         json_quoted(metadata_key_), found));
      case State::kField:
        switch (field_) {
          case Field::kDtype:
            fail_tensor(fmt::format("dtype is {}, expected a string such as \"F32\"", found));
          case Field::kShape:
            fail_tensor(
                fmt::format("shape is {}, expected an array of non-negative integers", found));
          case Field::kOffsets:
            fail_tensor(fmt::format("data_offsets is {}, expected [begin, end]", found));
        }
        break;
      case State::kShape:
        fail_tensor(fmt::format("shape holds {}, expected non-negative integers", found));
      case State::kOffsets:
        fail_tensor(fmt::format("data_offsets holds {}, expected non-negative integers", found));
      default:
        break;
    }
    fail(fmt::format("unexpected {}", found));
  }

  std::string_view what_;
  Header header_;
  State state_ = State::kStart;
  bool in_metadata_ = false;    // the current top-level key is "__metadata__"
  bool seen_metadata_ = false;  // "__metadata__" was a key already
  std::string metadata_key_;
  Field field_ = Field::kDtype;
  unsigned seen_fields_ = 0;  // bit per Field of the current entry
  int offsets_seen_ = 0;
};

void pread_all(int fd, std::span<std::byte> out, uint64_t offset,
               const std::filesystem::path& path) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError(fmt::format("{}: read of {} bytes at offset {} failed: {}", path.string(),
                                out.size() - done, offset + done, std::strerror(errno)));
    }
    if (n == 0) {
      throw IoError(
          fmt::format("{}: short read: the file ends at {} but {} bytes were wanted "
                      "there (was it truncated while open?)",
                      path.string(), offset + done, out.size() - done));
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

std::string_view element_type_name(ElementType t) { return type_info(t).name; }

std::optional<ElementType> parse_element_type(std::string_view name) {
  for (size_t i = 0; i < kTypes.size(); ++i) {
    if (kTypes[i].name == name) return static_cast<ElementType>(i);
  }
  return std::nullopt;
}

size_t element_size(ElementType t) { return type_info(t).size; }

ElementType element_type_of(DType t) {
  switch (t) {
    case DType::kF32:
      return ElementType::kF32;
    case DType::kF16:
      return ElementType::kF16;
    case DType::kBF16:
      return ElementType::kBF16;
    case DType::kU8:
      break;
  }
  throw InvalidArgument(
      fmt::format("safetensors: dtype {} is not f32, f16 or bf16", static_cast<int>(t)));
}

std::optional<DType> dtype_of(ElementType t) {
  switch (t) {
    case ElementType::kF32:
      return DType::kF32;
    case ElementType::kF16:
      return DType::kF16;
    case ElementType::kBF16:
      return DType::kBF16;
    default:
      return std::nullopt;
  }
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (const int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

namespace {

// Refuses a header that names a tensor twice.
void check_names_unique(const Header& header, std::string_view what) {
  std::vector<size_t> by_name(header.tensors.size());
  for (size_t i = 0; i < by_name.size(); ++i) by_name[i] = i;
  std::sort(by_name.begin(), by_name.end(),
            [&](size_t a, size_t b) { return header.tensors[a].name < header.tensors[b].name; });
  for (size_t i = 1; i < by_name.size(); ++i) {
    const std::string& name = header.tensors[by_name[i]].name;
    if (name == header.tensors[by_name[i - 1]].name) {
      throw CorruptData(
          fmt::format("{}: tensor {} appears twice in the header", what, json_quoted(name)));
    }
  }
}

// Refuses a tensor whose data_offsets do not hold exactly its shape's bytes inside the data
// section of a file of `file_size` bytes.
void check_data_offsets(const Header& header, uint64_t file_size, std::string_view what) {
  const uint64_t data_bytes = file_size - header.data_start;
  for (const TensorInfo& t : header.tensors) {
    const auto prefix_of = [&] { return fmt::format("{}: tensor {}", what, json_quoted(t.name)); };
    const std::string_view type = element_type_name(t.type);
    const std::optional<uint64_t> needed = checked_bytes(t.shape, element_size(t.type));
    if (!needed) {
      throw CorruptData(fmt::format("{}: {} shape {} needs 2^64 bytes or more", prefix_of(), type,
                                    shape_text(t.shape)));
    }
    if (t.begin > t.end) {
      throw CorruptData(fmt::format("{}: data_offsets [{}, {}) end before they begin", prefix_of(),
                                    t.begin, t.end));
    }
    if (t.end - t.begin != *needed) {
      throw CorruptData(fmt::format(
          "{}: data_offsets [{}, {}) hold {} bytes but {} shape {} "
          "needs {}",
          prefix_of(), t.begin, t.end, t.end - t.begin, type, shape_text(t.shape), *needed));
    }
    if (t.end > data_bytes) {
      throw CorruptData(
          fmt::format("{}: data_offsets [{}, {}) pass the end of the data section "
                      "({} bytes: the file has {}, the data starts at {}; "
                      "truncated?)",
                      prefix_of(), t.begin, t.end, data_bytes, file_size, header.data_start));
    }
  }
}

}  // namespace

Header parse_header(std::span<const std::byte> prefix, uint64_t file_size, std::string_view what) {
  if (prefix.size() > file_size) {
    throw InvalidArgument(fmt::format("{}: parse_header was given {} bytes of a {}-byte file", what,
                                      prefix.size(), file_size));
  }
  if (file_size < 8) {
    throw CorruptData(
        fmt::format("{}: the file is {} bytes, too short for a safetensors file "
                    "(an 8-byte header length, then the header)",
                    what, file_size));
  }
  if (prefix.size() < 8) {
    throw InvalidArgument(fmt::format("{}: parse_header was given {} bytes; it needs the first 8",
                                      what, prefix.size()));
  }
  const uint64_t header_bytes = load_le64(prefix.first(8));
  if (header_bytes > kMaxHeaderBytes) {
    throw CorruptData(
        fmt::format("{}: header length {} is over the {}-byte limit (not a "
                    "safetensors file, or a corrupt one)",
                    what, header_bytes, kMaxHeaderBytes));
  }
  if (header_bytes > file_size - 8) {
    throw CorruptData(
        fmt::format("{}: header length {} runs past the end of the file ({} bytes "
                    "leave room for at most {}; truncated?)",
                    what, header_bytes, file_size, file_size - 8));
  }
  if (prefix.size() - 8 < header_bytes) {
    throw InvalidArgument(fmt::format("{}: parse_header was given {} bytes; the header needs {}",
                                      what, prefix.size(), 8 + header_bytes));
  }

  const auto* json = reinterpret_cast<const char*>(prefix.data() + 8);
  // nlohmann's lexer stops at a NUL as at the end of input, so "{}\0garbage" would parse;
  // JSON has no raw NUL anywhere (strings escape it), so any NUL is an error.
  if (const void* nul = std::memchr(json, 0, header_bytes); nul != nullptr) {
    throw CorruptData(fmt::format("{}: header is not valid JSON: a NUL byte at header offset {}",
                                  what, static_cast<const char*>(nul) - json));
  }
  HeaderSax sax(what);
  nlohmann::json::sax_parse(json, json + header_bytes, &sax);
  Header header = sax.take();
  header.data_start = 8 + header_bytes;

  check_names_unique(header, what);
  check_data_offsets(header, file_size, what);

  std::stable_sort(header.tensors.begin(), header.tensors.end(),
                   [](const TensorInfo& a, const TensorInfo& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  // Sorted by begin, a tensor overlaps an earlier one exactly when it begins before the
  // furthest end so far. Empty tensors hold no bytes, so they overlap nothing.
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo& t : header.tensors) {
    if (t.begin == t.end) continue;
    if (furthest != nullptr && t.begin < furthest->end) {
      throw CorruptData(fmt::format("{}: tensors {} [{}, {}) and {} [{}, {}) overlap", what,
                                    json_quoted(furthest->name), furthest->begin, furthest->end,
                                    json_quoted(t.name), t.begin, t.end));
    }
    if (furthest == nullptr || t.end > furthest->end) furthest = &t;
  }
  return header;
}

// ---------------------------------------------------------------------------------------------
// Reader

Reader::Reader(const std::filesystem::path& path) : path_(path) {
  // Non-blocking, so that opening a FIFO returns at once instead of waiting for a writer;
  // it is refused below, and regular files ignore the flag.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) {
    throw IoError(
        fmt::format("{}: cannot open for reading: {}", path.string(), std::strerror(errno)));
  }
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      throw IoError(fmt::format("{}: cannot stat: {}", path.string(), std::strerror(errno)));
    }
    if (!S_ISREG(st.st_mode)) {
      const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                         : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISCHR(st.st_mode)  ? "a character device"
                         : S_ISBLK(st.st_mode)  ? "a block device"
                                                : "not a regular file";
      throw CorruptData(fmt::format(
          "{}: is {}; a safetensors file is a regular file (its size bounds every offset)",
          path.string(), kind));
    }
    file_size_ = static_cast<uint64_t>(st.st_size);
    std::vector<std::byte> prefix(std::min<uint64_t>(file_size_, 8));
    pread_all(fd_, prefix, 0, path_);
    if (prefix.size() == 8) {
      // Read the header only when its length is plausible; parse_header then explains a bad
      // one from these 8 bytes, and nothing is allocated from an unchecked length.
      const uint64_t header_bytes = load_le64(prefix);
      if (header_bytes <= kMaxHeaderBytes && header_bytes <= file_size_ - 8) {
        prefix.resize(8 + header_bytes);
        pread_all(fd_, std::span(prefix).subspan(8), 8, path_);
      }
    }
    header_ = parse_header(prefix, file_size_, path_.string());
  } catch (...) {
    ::close(fd_);
    throw;
  }
  by_name_.resize(header_.tensors.size());
  for (size_t i = 0; i < by_name_.size(); ++i) by_name_[i] = i;
  std::sort(by_name_.begin(), by_name_.end(),
            [&](size_t a, size_t b) { return header_.tensors[a].name < header_.tensors[b].name; });
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

Reader::Reader(Reader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      file_size_(other.file_size_),
      header_(std::move(other.header_)),
      by_name_(std::move(other.by_name_)) {}

Reader& Reader::operator=(Reader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    file_size_ = other.file_size_;
    header_ = std::move(other.header_);
    by_name_ = std::move(other.by_name_);
  }
  return *this;
}

const TensorInfo* Reader::find(std::string_view name) const {
  const auto it = std::lower_bound(
      by_name_.begin(), by_name_.end(), name,
      [&](size_t i, std::string_view n) { return std::string_view(header_.tensors[i].name) < n; });
  if (it == by_name_.end() || header_.tensors[*it].name != name) return nullptr;
  return &header_.tensors[*it];
}

const TensorInfo& Reader::expect(std::string_view name, ElementType type,
                                 std::span<const int64_t> shape) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) {
    throw CorruptData(fmt::format("{}: tensor {} is missing (the file holds {} tensors)",
                                  path_.string(), json_quoted(name), header_.tensors.size()));
  }
  if (t->type != type) {
    throw CorruptData(fmt::format("{}: tensor {} is {}, expected {}", path_.string(),
                                  json_quoted(name), element_type_name(t->type),
                                  element_type_name(type)));
  }
  if (!std::equal(t->shape.begin(), t->shape.end(), shape.begin(), shape.end())) {
    throw CorruptData(fmt::format("{}: tensor {} has shape {}, expected {}", path_.string(),
                                  json_quoted(name), shape_text(t->shape), shape_text(shape)));
  }
  return *t;
}

void Reader::read(const TensorInfo& t, uint64_t first_element, std::span<std::byte> out) const {
  const size_t es = element_size(t.type);
  if (out.size() % es != 0) {
    throw InvalidArgument(fmt::format(
        "{}: reading tensor {} ({}) into {} bytes, not a whole "
        "number of {}-byte elements",
        path_.string(), json_quoted(t.name), element_type_name(t.type), out.size(), es));
  }
  const uint64_t count = out.size() / es;
  const uint64_t numel = t.numel();
  if (first_element > numel || count > numel - first_element) {
    throw InvalidArgument(fmt::format(
        "{}: elements [{}, {} + {}) of tensor {} pass its end ({} "
        "elements)",
        path_.string(), first_element, first_element, count, json_quoted(t.name), numel));
  }
  if (fd_ < 0) {
    throw InvalidArgument(fmt::format("{}: read from a moved-from Reader", path_.string()));
  }
  if (out.empty()) return;
  pread_all(fd_, out, header_.data_start + t.begin + first_element * es, path_);
}

}  // namespace zerodp::safetensors
