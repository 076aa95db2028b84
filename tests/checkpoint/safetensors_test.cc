#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/sha256.h"
#include "temp_dir.h"

namespace zerodp::safetensors {
namespace {

using zerodp::testing::TempDir;

std::vector<std::byte> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A file of the given header text, its length field (the text's length unless given), and
// `data_bytes` bytes of data.
std::vector<std::byte> raw_file(std::string_view json, size_t data_bytes,
                                std::optional<uint64_t> length = std::nullopt) {
  const uint64_t n = length.value_or(json.size());
  std::vector<std::byte> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(n >> (8 * i)));
  for (const char c : json) out.push_back(static_cast<std::byte>(c));
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<std::byte>(i * 7 + 1));
  return out;
}

// Runs `fn`, expecting CorruptData whose message contains every one of `parts`.
template <typename Fn>
void expect_corrupt(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected CorruptData";
  } catch (const CorruptData& e) {
    for (const auto& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message lacks \"" << part << "\": " << e.what();
    }
  }
}

template <typename Fn>
void expect_invalid(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    for (const auto& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message lacks \"" << part << "\": " << e.what();
    }
  }
}

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span(v));
}

// Writes `bytes` in chunks cycling through odd sizes, so chunks straddle tensor boundaries.
void write_in_odd_chunks(Writer& w, std::span<const std::byte> bytes) {
  static constexpr size_t kChunks[] = {1, 3, 7, 13, 5, 61, 2, 1021};
  size_t done = 0;
  for (size_t i = 0; done < bytes.size(); ++i) {
    const size_t n = std::min(kChunks[i % std::size(kChunks)], bytes.size() - done);
    w.write(bytes.subspan(done, n));
    done += n;
  }
}

// Three tensors of zerodp's dtypes, a scalar and an empty one, with their bytes.
struct Sample {
  std::vector<float> weight;    // F32 [3, 5]
  std::vector<BFloat16> bias;   // BF16 [7]
  std::vector<Float16> scales;  // F16 [2, 3, 4]
  std::vector<float> step;      // F32 [] (a scalar)
  std::map<std::string, std::string> metadata = {{"format", "zerodp"}, {"step", "12"}};

  Sample() {
    for (int i = 0; i < 15; ++i) weight.push_back(static_cast<float>(i) * 0.25f - 1.0f);
    for (uint16_t i = 0; i < 7; ++i) bias.push_back(BFloat16{static_cast<uint16_t>(0x3f80 + i)});
    for (uint16_t i = 0; i < 24; ++i) scales.push_back(Float16{static_cast<uint16_t>(0x3c00 + i)});
    step.push_back(12.0f);
  }
  std::vector<TensorDecl> decls() const {
    return {{"weight", ElementType::kF32, {3, 5}},
            {"bias", ElementType::kBF16, {7}},
            {"empty", ElementType::kF32, {0, 4}},
            {"scales", ElementType::kF16, {2, 3, 4}},
            {"step", ElementType::kF32, {}}};
  }
  // Every tensor's bytes, in declaration order.
  std::vector<std::byte> data() const {
    std::vector<std::byte> out;
    for (auto b : {bytes_of(weight), bytes_of(bias), bytes_of(scales), bytes_of(step)}) {
      out.insert(out.end(), b.begin(), b.end());
    }
    return out;
  }
  std::string write(const std::filesystem::path& path) const {
    Writer w(path, decls(), metadata);
    write_in_odd_chunks(w, data());
    return w.finish();
  }
};

template <typename T>
std::vector<T> read_all(const Reader& r, const TensorInfo& t) {
  std::vector<T> out(t.numel());
  r.read(t, 0, std::as_writable_bytes(std::span(out)));
  return out;
}

TEST(ElementType, NamesSizesAndDTypes) {
  EXPECT_EQ(element_type_name(ElementType::kBF16), "BF16");
  EXPECT_EQ(element_type_name(ElementType::kBool), "BOOL");
  for (const auto t : {ElementType::kF64, ElementType::kF32, ElementType::kF16, ElementType::kBF16,
                       ElementType::kI64, ElementType::kI32, ElementType::kI16, ElementType::kI8,
                       ElementType::kU8, ElementType::kBool}) {
    EXPECT_EQ(parse_element_type(element_type_name(t)), t);
  }
  EXPECT_EQ(parse_element_type("f32"), std::nullopt);  // the format's names are upper case
  EXPECT_EQ(parse_element_type("F8_E4M3"), std::nullopt);
  EXPECT_EQ(element_size(ElementType::kF64), 8u);
  EXPECT_EQ(element_size(ElementType::kF32), 4u);
  EXPECT_EQ(element_size(ElementType::kBF16), 2u);
  EXPECT_EQ(element_size(ElementType::kU8), 1u);
  for (const auto d : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(dtype_of(element_type_of(d)), d);
    EXPECT_EQ(element_size(element_type_of(d)), dtype_size(d));
  }
  EXPECT_EQ(dtype_of(ElementType::kI64), std::nullopt);
}

TEST(Safetensors, RoundTripInOddChunks) {
  TempDir dir;
  const Sample s;
  const auto path = dir.path() / "shard.safetensors";
  s.write(path);

  const Reader r(path);
  EXPECT_EQ(r.file_size(), std::filesystem::file_size(path));
  EXPECT_EQ(r.header().metadata, s.metadata);
  EXPECT_EQ(r.header().data_start % 8, 0u);
  EXPECT_EQ(r.file_size(), r.header().data_start + s.data().size());

  // Contiguous in declaration order, so data-offset order is declaration order.
  const auto decls = s.decls();
  ASSERT_EQ(r.header().tensors.size(), decls.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < decls.size(); ++i) {
    const TensorInfo& t = r.header().tensors[i];
    EXPECT_EQ(t.name, decls[i].name);
    EXPECT_EQ(t.type, decls[i].type);
    EXPECT_EQ(t.shape, decls[i].shape);
    EXPECT_EQ(t.begin, offset);
    EXPECT_EQ(t.bytes(), t.numel() * element_size(t.type));
    offset = t.end;
  }

  EXPECT_EQ(read_all<float>(r, r.expect("weight", ElementType::kF32, std::vector<int64_t>{3, 5})),
            s.weight);
  EXPECT_EQ(read_all<BFloat16>(r, r.expect("bias", ElementType::kBF16, std::vector<int64_t>{7})),
            s.bias);
  EXPECT_EQ(
      read_all<Float16>(r, r.expect("scales", ElementType::kF16, std::vector<int64_t>{2, 3, 4})),
      s.scales);
  const TensorInfo& step = r.expect("step", ElementType::kF32, {});
  EXPECT_EQ(step.numel(), 1u);
  EXPECT_EQ(read_all<float>(r, step), s.step);
  const TensorInfo& empty = r.expect("empty", ElementType::kF32, std::vector<int64_t>{0, 4});
  EXPECT_EQ(empty.numel(), 0u);
  EXPECT_TRUE(read_all<float>(r, empty).empty());
}

TEST(Safetensors, LargeTensorInMixedChunks) {
  // Past the writer's staging buffer, so writes both gather and go straight through.
  TempDir dir;
  const auto path = dir.path() / "big.safetensors";
  std::vector<float> a(300001), b(17);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);
  std::vector<std::byte> data(bytes_of(a).begin(), bytes_of(a).end());
  data.insert(data.end(), bytes_of(b).begin(), bytes_of(b).end());
  Writer w(path, {{"a", ElementType::kF32, {static_cast<int64_t>(a.size())}},
                  {"b", ElementType::kF32, {17}}});
  size_t done = 0;
  for (const size_t n : {size_t{3}, size_t{700001}, size_t{1}, size_t{262144}, size_t{99}}) {
    w.write(std::span(data).subspan(done, n));
    done += n;
  }
  w.write(std::span(data).subspan(done));
  const std::string sha = w.finish();
  EXPECT_EQ(sha, sha256_file_hex(path));

  const Reader r(path);
  EXPECT_EQ(read_all<float>(r, *r.find("a")), a);
  EXPECT_EQ(read_all<float>(r, *r.find("b")), b);
}

// Direct I/O writes the same bytes as the page cache does: across several of its 1 MiB
// buffers, a tail that is not a whole 4 KiB block, chunks of every size; on the disk, and on a
// tmpfs (/dev/shm), which may refuse O_DIRECT, so the writer falls back.
TEST(Safetensors, DirectWritesAreTheBufferedBytes) {
  TempDir dir;
  std::vector<float> a(1000001), b(4099);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);
  std::vector<std::byte> data(bytes_of(a).begin(), bytes_of(a).end());
  data.insert(data.end(), bytes_of(b).begin(), bytes_of(b).end());
  const auto write = [&](const std::filesystem::path& path, WriteMode mode) {
    Writer w(path,
             {{"a", ElementType::kF32, {static_cast<int64_t>(a.size())}},
              {"b", ElementType::kF32, {static_cast<int64_t>(b.size())}}},
             {{"k", "v"}}, mode);
    size_t done = 0;
    for (const size_t n : {size_t{5}, size_t{1} << 20, size_t{4096}, size_t{2000001}, size_t{1}}) {
      w.write(std::span(data).subspan(done, n));
      done += n;
    }
    w.write(std::span(data).subspan(done));
    return w.finish();
  };
  const auto buffered = dir.path() / "buffered.safetensors";
  const std::string want = write(buffered, WriteMode::kBuffered);
  const std::vector<std::byte> bytes = read_file(buffered);
  std::vector<std::filesystem::path> places{dir.path()};
  if (std::filesystem::is_directory("/dev/shm")) places.emplace_back("/dev/shm");
  for (const std::filesystem::path& place : places) {
    const auto direct = place / ("zerodp-direct-" + std::to_string(::getpid()) + ".safetensors");
    EXPECT_EQ(write(direct, WriteMode::kDirect), want) << place;
    EXPECT_TRUE(read_file(direct) == bytes) << place;
    const Reader r(direct);
    EXPECT_EQ(read_all<float>(r, *r.find("b")), b) << place;
    std::filesystem::remove(direct);
  }
}

// Data placed where a caller that stages a file places it (at an address congruent to the
// header's length modulo 4 KiB) is written in place, uncopied, all but the first block and
// the tail; the file is the buffered writer's, byte for byte, and so is its digest. Where the
// file system refuses O_DIRECT nothing goes in place.
TEST(Safetensors, DirectWritesFromBlockAlignedMemoryGoInPlace) {
  TempDir dir;
  std::vector<float> a(1500007), b(333);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.25f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i) - 7.0f;
  const std::vector<TensorDecl> tensors{{"a", ElementType::kF32, {static_cast<int64_t>(a.size())}},
                                        {"b", ElementType::kF32, {static_cast<int64_t>(b.size())}}};
  const std::map<std::string, std::string> meta{{"k", "v"}};
  const uint64_t header = header_bytes(tensors, meta);
  const size_t data_bytes = (a.size() + b.size()) * 4;
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  const std::unique_ptr<std::byte, Free> staging(
      static_cast<std::byte*>(std::aligned_alloc(4096, (data_bytes / 4096 + 2) * 4096)));
  std::byte* data = staging.get() + header % 4096;
  std::memcpy(data, a.data(), a.size() * 4);
  std::memcpy(data + a.size() * 4, b.data(), b.size() * 4);
  const auto write = [&](const std::filesystem::path& path, WriteMode mode, Digest digest,
                         uint64_t* in_place) {
    Writer w(path, tensors, meta, mode, digest);
    EXPECT_EQ(w.header_bytes(), header);
    // In pieces of 3 MiB, as the checkpoint writer hands its staging over.
    constexpr size_t kPiece = size_t{3} << 20;
    for (size_t at = 0; at < data_bytes; at += kPiece) {
      w.write({data + at, std::min(kPiece, data_bytes - at)});
    }
    const std::string d = w.finish();
    if (in_place != nullptr) *in_place = w.bytes_in_place();
    return d;
  };
  const auto buffered = dir.path() / "buffered.safetensors";
  for (const Digest digest : {Digest::kSha256, Digest::kCrc32c}) {
    const std::string want = write(buffered, WriteMode::kBuffered, digest, nullptr);
    EXPECT_EQ(want.size(), digest == Digest::kSha256 ? 64u : 8u);
    const std::vector<std::byte> bytes = read_file(buffered);
    std::vector<std::filesystem::path> places{dir.path()};
    if (std::filesystem::is_directory("/dev/shm")) places.emplace_back("/dev/shm");
    for (const std::filesystem::path& place : places) {
      const auto direct = place / ("zerodp-inplace-" + std::to_string(::getpid()) + ".safetensors");
      uint64_t in_place = 0;
      EXPECT_EQ(write(direct, WriteMode::kDirect, digest, &in_place), want) << place;
      EXPECT_TRUE(read_file(direct) == bytes) << place;
      if (in_place == 0) {
        const int fd = ::open(direct.c_str(), O_WRONLY | O_DIRECT);
        EXPECT_LT(fd, 0) << place << ": O_DIRECT opens, yet nothing was written in place";
        if (fd >= 0) ::close(fd);
      } else {
        EXPECT_GE(in_place, data_bytes - 3 * 4096) << place;
      }
      std::filesystem::remove(direct);
    }
  }
}

TEST(Safetensors, FinishReturnsTheSha256OfTheFile) {
  TempDir dir;
  const auto path = dir.path() / "shard.safetensors";
  const std::string sha = Sample().write(path);
  EXPECT_EQ(sha.size(), 64u);
  EXPECT_EQ(sha, sha256_file_hex(path));
  EXPECT_EQ(sha, sha256_hex(read_file(path)));
}

TEST(Safetensors, ReadsElementRanges) {
  TempDir dir;
  const Sample s;
  const auto path = dir.path() / "shard.safetensors";
  s.write(path);
  const Reader r(path);
  const TensorInfo& w = *r.find("weight");

  std::vector<float> mid(4);
  r.read(w, 5, std::as_writable_bytes(std::span(mid)));
  EXPECT_EQ(mid, std::vector<float>(s.weight.begin() + 5, s.weight.begin() + 9));
  std::vector<float> last(1);
  r.read(w, 14, std::as_writable_bytes(std::span(last)));
  EXPECT_EQ(last[0], s.weight[14]);
  std::vector<Float16> part(5);
  r.read(*r.find("scales"), 19, std::as_writable_bytes(std::span(part)));
  EXPECT_EQ(part, std::vector<Float16>(s.scales.begin() + 19, s.scales.end()));
  r.read(w, 15, {});  // nothing, at the end: allowed

  std::vector<float> two(2);
  expect_invalid([&] { r.read(w, 14, std::as_writable_bytes(std::span(two))); },
                 {"\"weight\"", "15 elements"});
  expect_invalid([&] { r.read(w, 16, {}); }, {"\"weight\""});
  std::vector<std::byte> odd(6);
  expect_invalid([&] { r.read(w, 0, odd); }, {"\"weight\"", "6 bytes", "4-byte"});
}

TEST(Safetensors, IndependentReaderSeesTheFormat) {
  // Parses the file by hand, as another implementation would, without zerodp's reader.
  TempDir dir;
  const Sample s;
  const auto path = dir.path() / "shard.safetensors";
  s.write(path);
  const std::vector<std::byte> file = read_file(path);
  ASSERT_GE(file.size(), 8u);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<uint64_t>(file[size_t(i)]);
  ASSERT_LE(8 + n, file.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data section not 8-aligned";
  const std::string text(reinterpret_cast<const char*>(file.data() + 8), n);
  EXPECT_EQ(text.front(), '{');
  const size_t close = text.find_last_of('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_LT(text.size() - close - 1, 8u) << "padding is more than alignment needs";
  EXPECT_EQ(text.find_first_not_of(' ', close + 1), std::string::npos) << "padding is not spaces";

  const nlohmann::json header = nlohmann::json::parse(text);
  ASSERT_TRUE(header.is_object());
  EXPECT_EQ(header.size(), s.decls().size() + 1);
  EXPECT_EQ(header.at("__metadata__"), nlohmann::json(s.metadata));

  const std::vector<std::byte> data = s.data();
  EXPECT_EQ(file.size(), 8 + n + data.size());
  uint64_t offset = 0;
  for (const TensorDecl& d : s.decls()) {
    SCOPED_TRACE(d.name);
    const nlohmann::json& e = header.at(d.name);
    EXPECT_EQ(e.size(), 3u);
    EXPECT_EQ(e.at("dtype"), std::string(element_type_name(d.type)));
    EXPECT_EQ(e.at("shape"), nlohmann::json(d.shape));
    const auto begin = e.at("data_offsets").at(0).get<uint64_t>();
    const auto end = e.at("data_offsets").at(1).get<uint64_t>();
    EXPECT_EQ(begin, offset);
    uint64_t numel = 1;
    for (const int64_t x : d.shape) numel *= static_cast<uint64_t>(x);
    EXPECT_EQ(end - begin, numel * element_size(d.type));
    offset = end;
  }
  EXPECT_EQ(offset, data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), file.begin() + static_cast<ptrdiff_t>(8 + n)));
}

TEST(Safetensors, NoMetadataNoTensors) {
  TempDir dir;
  const auto path = dir.path() / "empty.safetensors";
  Writer w(path, {});
  const std::string sha = w.finish();
  EXPECT_EQ(sha, sha256_file_hex(path));
  const std::vector<std::byte> file = read_file(path);
  ASSERT_EQ(file.size(), 16u);  // "{}" padded to 8
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file.data() + 8), 8), "{}      ");
  const Reader r(path);
  EXPECT_TRUE(r.header().tensors.empty());
  EXPECT_TRUE(r.header().metadata.empty());
}

TEST(Safetensors, DataSectionAlignedForEveryHeaderLength) {
  TempDir dir;
  for (size_t len = 1; len <= 17; ++len) {
    const auto path = dir.path() / "a.safetensors";
    Writer w(path, {{std::string(len, 'x'), ElementType::kU8, {3}}});
    const std::vector<std::byte> three(3, std::byte{9});
    w.write(three);
    w.finish();
    const Reader r(path);
    EXPECT_EQ(r.header().data_start % 8, 0u) << "name length " << len;
  }
}

TEST(Safetensors, ForeignLayoutsAreRead) {
  // Another writer's choices: key order unlike data order, holes, an unpadded header, and
  // element types zerodp does not compute with.
  TempDir dir;
  const auto path = dir.path() / "foreign.safetensors";
  const std::string json =
      R"({"b":{"shape":[2],"dtype":"I64","data_offsets":[24,40]},)"
      R"("a":{"data_offsets":[0,3],"dtype":"BOOL","shape":[3]},)"
      R"("z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}, "__metadata__":{}})";
  write_file(path, raw_file(json, 48));
  const Reader r(path);
  ASSERT_EQ(r.header().tensors.size(), 3u);
  EXPECT_EQ(r.header().tensors[0].name, "a");  // by data offset
  EXPECT_EQ(r.header().tensors[1].name, "z");
  EXPECT_EQ(r.header().tensors[2].name, "b");
  EXPECT_EQ(r.header().data_start, 8 + json.size());
  const TensorInfo& b = r.expect("b", ElementType::kI64, std::vector<int64_t>{2});
  std::vector<std::byte> out(16);
  r.read(b, 0, out);
  const std::vector<std::byte> file = raw_file(json, 48);
  EXPECT_TRUE(std::equal(out.begin(), out.end(),
                         file.begin() + static_cast<ptrdiff_t>(8 + json.size() + 24)));
  EXPECT_EQ(r.find("nope"), nullptr);
}

TEST(Safetensors, ExpectChecksPresenceTypeAndShape) {
  TempDir dir;
  const auto path = dir.path() / "shard.safetensors";
  Sample().write(path);
  const Reader r(path);
  const std::string file = path.string();
  expect_corrupt([&] { r.expect("missing", ElementType::kF32, {}); },
                 {file, "\"missing\"", "missing"});
  expect_corrupt([&] { r.expect("bias", ElementType::kF32, std::vector<int64_t>{7}); },
                 {file, "\"bias\"", "BF16", "expected F32"});
  expect_corrupt(
      [&] {
        r.expect("weight", ElementType::kF32, std::vector<int64_t>{5, 3});
      },
      {file, "\"weight\"", "[3, 5]", "expected [5, 3]"});
  expect_corrupt([&] { r.expect("step", ElementType::kF32, std::vector<int64_t>{1}); },
                 {"\"step\"", "shape []", "expected [1]"});
}

TEST(Safetensors, ReaderMoves) {
  TempDir dir;
  const Sample s;
  const auto path = dir.path() / "shard.safetensors";
  s.write(path);
  Reader a(path);
  Reader b(std::move(a));
  EXPECT_EQ(read_all<float>(b, *b.find("weight")), s.weight);
  Reader c(path);
  c = std::move(b);
  EXPECT_EQ(read_all<float>(c, *c.find("step")), s.step);
}

TEST(Safetensors, ReaderIoErrors) {
  TempDir dir;
  try {
    Reader r(dir.path() / "absent.safetensors");
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("absent.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
}

// A path that is not a regular file is corrupt data naming it, and a FIFO is refused at
// once: a blocking open would wait for a writer forever.
TEST(Safetensors, ReaderRefusesWhatIsNotARegularFile) {
  TempDir dir;
  const std::filesystem::path fifo = dir.path() / "fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::filesystem::path zero = dir.path() / "zero.safetensors";
  std::filesystem::create_symlink("/dev/zero", zero);
  for (const auto& [path, kind] :
       {std::pair{dir.path(), "is a directory"}, std::pair{fifo, "is a FIFO"},
        std::pair{zero, "is a character device"}}) {
    try {
      Reader r(path);
      ADD_FAILURE() << "expected CorruptData for " << path;
    } catch (const CorruptData& e) {
      EXPECT_NE(std::string(e.what()).find(path.string() + ": " + kind), std::string::npos)
          << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Writer misuse

TEST(SafetensorsWriter, TooManyBytes) {
  TempDir dir;
  const auto path = dir.path() / "w.safetensors";
  Writer w(path, {{"a", ElementType::kF32, {2}}, {"b", ElementType::kBF16, {3}}});
  const std::vector<std::byte> bytes(15);
  expect_invalid([&] { w.write(bytes); }, {path.string(), "\"b\"", "15 bytes", "by 1"});
  w.write(std::span(bytes).first(10));
  expect_invalid([&] { w.write(std::span(bytes).first(5)); }, {"\"b\"", "by 1"});
  w.write(std::span(bytes).first(4));  // the refused writes wrote nothing
  const std::string sha = w.finish();  // before the file is read
  EXPECT_EQ(sha, sha256_file_hex(path));
  expect_invalid([&] { w.write(std::span(bytes).first(1)); }, {"after finish"});
  expect_invalid([&] { w.finish(); }, {"after finish"});
}

TEST(SafetensorsWriter, FinishBeforeAllBytes) {
  TempDir dir;
  const auto path = dir.path() / "w.safetensors";
  Writer w(path, {{"a", ElementType::kF32, {2}}, {"b", ElementType::kBF16, {3}}});
  const std::vector<std::byte> bytes(14);
  w.write(std::span(bytes).first(9));
  expect_invalid([&] { w.finish(); }, {path.string(), "\"b\"", "1 of its 6 bytes", "5 of 14"});
  w.write(std::span(bytes).first(5));  // still usable: the rest completes the file
  const std::string sha = w.finish();  // before the file is read
  EXPECT_EQ(sha, sha256_file_hex(path));
  const Reader r(path);
  EXPECT_EQ(r.header().tensors.size(), 2u);
}

TEST(SafetensorsWriter, BadDeclarations) {
  TempDir dir;
  const auto path = dir.path() / "w.safetensors";
  expect_invalid(
      [&] {
        Writer w(path, {{"a", ElementType::kF32, {2}}, {"a", ElementType::kF16, {1}}});
      },
      {path.string(), "\"a\"", "declared twice"});
  expect_invalid([&] { Writer w(path, {{"", ElementType::kF32, {2}}}); }, {"empty name"});
  expect_invalid(
      [&] {
        Writer w(path, {{"__metadata__", ElementType::kF32, {2}}});
      },
      {"\"__metadata__\"", "reserves"});
  expect_invalid([&] { Writer w(path, {{"__x", ElementType::kF32, {2}}}); }, {"\"__x\""});
  expect_invalid(
      [&] {
        Writer w(path, {{"n", ElementType::kF32, {2, -1}}});
      },
      {"\"n\"", "[2, -1]", "negative"});
  expect_invalid(
      [&] {
        Writer w(path, {{"huge", ElementType::kF32, {int64_t{1} << 62}}});
      },
      {"\"huge\"", "2^64"});
  expect_invalid([&] { Writer w(path, {{"\xff", ElementType::kF32, {1}}}); }, {"UTF-8"});
  EXPECT_FALSE(std::filesystem::exists(path)) << "a refused declaration created the file";
}

TEST(SafetensorsWriter, IoErrorNamesTheFile) {
  TempDir dir;
  const auto path = dir.path() / "no-such-dir" / "w.safetensors";
  try {
    Writer w(path, {});
    ADD_FAILURE() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsWriter, WriteErrorsNameTheFileAndStick) {
  const std::filesystem::path full = "/dev/full";  // every write fails with ENOSPC
  if (!std::filesystem::exists(full)) GTEST_SKIP() << "no /dev/full";
  {
    // Small writes are staged, so the failure surfaces at finish().
    Writer w(full, {{"a", ElementType::kF32, {1}}});
    const std::vector<std::byte> four(4);
    w.write(four);
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        w.finish();
        ADD_FAILURE() << "expected IoError";
      } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("No space left"), std::string::npos) << e.what();
      }
    }
  }
  {
    // A write larger than the staging buffer goes straight to the file and fails there.
    Writer w(full, {{"a", ElementType::kU8, {1 << 20}}});
    const std::vector<std::byte> big(1 << 20);
    EXPECT_THROW(w.write(big), IoError);
    EXPECT_THROW(w.write(std::span(big).first(1)), IoError);
  }
}

TEST(SafetensorsWriter, WriteValues) {
  TempDir dir;
  const auto path = dir.path() / "w.safetensors";
  const std::vector<float> a = {1.5f, -2.0f, 3.25f};
  const std::vector<BFloat16> b = {BFloat16{0x3f80}, BFloat16{0xc000}};
  Writer w(path, {{"a", ElementType::kF32, {3}}, {"b", ElementType::kBF16, {2}}});
  w.write_values(std::span(a));
  w.write_values(std::span(b));
  w.finish();
  const Reader r(path);
  EXPECT_EQ(read_all<float>(r, *r.find("a")), a);
  EXPECT_EQ(read_all<BFloat16>(r, *r.find("b")), b);
}

TEST(SafetensorsWriter, UnfinishedFileStaysIncomplete) {
  TempDir dir;
  const auto path = dir.path() / "w.safetensors";
  {
    Writer w(path, {{"a", ElementType::kF32, {4}}});
    const std::vector<std::byte> bytes(4);
    w.write(bytes);
  }
  ASSERT_TRUE(std::filesystem::exists(path));
  expect_corrupt([&] { Reader r(path); }, {"\"a\"", "pass the end of the data section"});
}

// ---------------------------------------------------------------------------------------------
// parse_header's arguments

TEST(ParseHeader, IgnoresBytesPastTheHeaderAndNeedsAllOfIt) {
  const std::string json = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  const std::vector<std::byte> file = raw_file(json, 4);
  const Header h = parse_header(file, file.size(), "f");
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.data_start, 8 + json.size());
  EXPECT_EQ(parse_header(std::span(file).first(8 + json.size()), file.size(), "f").tensors.size(),
            1u);
  EXPECT_THROW(parse_header(std::span(file).first(8 + json.size() - 1), file.size(), "f"),
               InvalidArgument);
  EXPECT_THROW(parse_header(file, file.size() - 1, "f"), InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Corrupt files: one case per rule. Each must be CorruptData naming the file and the reason
// (and the tensor, where there is one).

struct CorruptCase {
  std::string name;
  std::vector<std::byte> bytes;
  std::vector<std::string> parts;
};

std::string entry(std::string_view dtype, std::string_view shape, std::string_view offsets) {
  return "{\"dtype\":\"" + std::string(dtype) + "\",\"shape\":" + std::string(shape) +
         ",\"data_offsets\":" + std::string(offsets) + "}";
}

// A valid one-tensor file to truncate.
const std::string kValid = "{\"w\":" + entry("F32", "[2]", "[0,8]") + "}";

std::vector<std::byte> truncated(size_t size) {
  std::vector<std::byte> f = raw_file(kValid, 8);
  f.resize(size);
  return f;
}

std::vector<CorruptCase> corrupt_cases() {
  const std::string ok = entry("F32", "[1]", "[0,4]");
  std::vector<CorruptCase> c = {
      // The length and the file.
      {"EmptyFile", {}, {"0 bytes", "too short"}},
      {"ShorterThanLength", std::vector<std::byte>(5), {"5 bytes", "too short"}},
      {"LengthPastFile", raw_file("{}", 0, 100), {"header length 100", "past the end"}},
      {"LengthOverLimit", raw_file("{}", 0, kMaxHeaderBytes + 1), {"104857601", "limit"}},
      {"TruncatedInLength", truncated(7), {"7 bytes", "too short"}},
      {"TruncatedInHeader", truncated(8 + kValid.size() / 2), {"header length", "past the end"}},
      {"TruncatedInData", truncated(8 + kValid.size() + 7), {"\"w\"", "[0, 8)", "7 bytes"}},
      // JSON syntax.
      {"LengthZero", raw_file("", 0), {"not valid JSON"}},
      {"NotJson", raw_file("garbage!", 0), {"not valid JSON"}},
      {"TruncatedJson", raw_file(R"({"a":{"dtype":"F32")", 0), {"not valid JSON"}},
      {"TrailingGarbage", raw_file("{} x", 0), {"not valid JSON"}},
      {"NulPadding", raw_file(std::string("{}\0\0", 4), 0), {"NUL byte at header offset 2"}},
      {"NulThenGarbage", raw_file(std::string("{}\0x", 4), 0), {"NUL byte at header offset 2"}},
      {"InvalidUtf8Name", raw_file("{\"\xff\":" + ok + "}", 4), {"not valid JSON"}},
      // Top level.
      {"TopLevelArray", raw_file("[1, 2]", 0), {"header is an array", "expected a JSON object"}},
      {"TopLevelString", raw_file(R"("x")", 0), {"header is a string"}},
      {"DuplicateTensor",
       raw_file("{\"a\":" + ok + ",\"a\":" + entry("F32", "[1]", "[4,8]") + "}", 8),
       {"\"a\"", "appears twice"}},
      {"DuplicateMetadata",
       raw_file(R"({"__metadata__":{},"__metadata__":{}})", 0),
       {"\"__metadata__\"", "appears twice"}},
      {"EntryNotObject", raw_file(R"({"a":[0,4]})", 4), {"\"a\"", "entry is an array"}},
      // Fields of an entry.
      {"DuplicateField",
       raw_file(R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", 4),
       {"\"a\"", "\"dtype\" appears twice"}},
      {"MissingField",
       raw_file(R"({"a":{"dtype":"F32","shape":[1]}})", 4),
       {"\"a\"", "missing field \"data_offsets\""}},
      {"ExtraField",
       raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"offset":0}})", 4),
       {"\"a\"", "unknown field \"offset\""}},
      {"DtypeNotString",
       raw_file(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4),
       {"\"a\"", "dtype is an integer"}},
      {"DtypeLowerCase",
       raw_file("{\"a\":" + entry("f32", "[1]", "[0,4]") + "}", 4),
       {"\"a\"", "unknown dtype \"f32\""}},
      {"UnknownDtype",
       raw_file("{\"a\":" + entry("F8_E4M3", "[1]", "[0,1]") + "}", 1),
       {"\"a\"", "unknown dtype \"F8_E4M3\"", "BF16"}},
      {"ShapeNotArray",
       raw_file("{\"a\":" + entry("F32", "1", "[0,4]") + "}", 4),
       {"\"a\"", "shape is an integer"}},
      {"ShapeFloat",
       raw_file("{\"a\":" + entry("F32", "[2.5]", "[0,4]") + "}", 4),
       {"\"a\"", "shape holds the number 2.5"}},
      {"ShapeString",
       raw_file("{\"a\":" + entry("F32", "[\"1\"]", "[0,4]") + "}", 4),
       {"\"a\"", "shape holds a string"}},
      {"ShapeNested",
       raw_file("{\"a\":" + entry("F32", "[[1]]", "[0,4]") + "}", 4),
       {"\"a\"", "shape holds an array"}},
      {"ShapeNull",
       raw_file("{\"a\":" + entry("F32", "null", "[0,4]") + "}", 4),
       {"\"a\"", "shape is null"}},
      {"NegativeDim",
       raw_file("{\"a\":" + entry("F32", "[2,-1]", "[0,4]") + "}", 4),
       {"\"a\"", "negative dimension -1"}},
      {"DimPastInt64",
       raw_file("{\"a\":" + entry("F32", "[9223372036854775808]", "[0,4]") + "}", 4),
       {"\"a\"", "9223372036854775808", "int64"}},
      {"OffsetsOneValue",
       raw_file("{\"a\":" + entry("F32", "[1]", "[4]") + "}", 4),
       {"\"a\"", "holds 1 value,", "[begin, end]"}},
      {"OffsetsThreeValues",
       raw_file("{\"a\":" + entry("F32", "[1]", "[0,4,8]") + "}", 8),
       {"\"a\"", "more than 2 values"}},
      {"OffsetsNotArray",
       raw_file("{\"a\":" + entry("F32", "[1]", "{}") + "}", 4),
       {"\"a\"", "data_offsets is an object"}},
      {"OffsetsFloat",
       raw_file("{\"a\":" + entry("F32", "[1]", "[0,4.0]") + "}", 4),
       {"\"a\"", "the number 4.0"}},
      {"OffsetsNegative",
       raw_file("{\"a\":" + entry("F32", "[1]", "[-4,0]") + "}", 4),
       {"\"a\"", "negative offset -4"}},
      {"OffsetsPast2To64",
       raw_file("{\"a\":" + entry("F32", "[1]", "[0,18446744073709551616]") + "}", 4),
       {"\"a\"", "18446744073709551616"}},
      // Sizes and offsets.
      {"BytesOverflow",
       raw_file("{\"a\":" + entry("F32", "[4294967296,4294967296]", "[0,4]") + "}", 4),
       {"\"a\"", "[4294967296, 4294967296]", "2^64"}},
      {"ByteCountMismatch",
       raw_file("{\"h.0.master\":" + entry("F32", "[99]", "[0,400]") + "}", 400),
       {"ckpt/rank_00001.safetensors: tensor \"h.0.master\": data_offsets [0, 400) hold 400 "
        "bytes but F32 shape [99] needs 396"}},
      {"BeginAfterEnd",
       raw_file("{\"a\":" + entry("U8", "[0]", "[8,4]") + "}", 8),
       {"\"a\"", "[8, 4)", "end before they begin"}},
      {"PastDataSection",
       raw_file("{\"a\":" + entry("F32", "[100]", "[0,400]") + "}", 396),
       {"\"a\"", "[0, 400)", "396 bytes"}},
      {"Overlap",
       raw_file("{\"a\":" + entry("F32", "[2]", "[0,8]") +
                    ",\"b\":" + entry("F32", "[2]", "[4,12]") + "}",
                12),
       {"\"a\" [0, 8)", "\"b\" [4, 12)", "overlap"}},
      {"OverlapContained",
       raw_file("{\"outer\":" + entry("F32", "[4]", "[0,16]") +
                    ",\"inner\":" + entry("F32", "[1]", "[4,8]") +
                    ",\"after\":" + entry("F32", "[1]", "[16,20]") + "}",
                20),
       {"\"outer\"", "\"inner\"", "overlap"}},
      {"OverlapAfterAnEmptyOne",
       raw_file("{\"a\":" + entry("F32", "[3]", "[0,12]") + ",\"e\":" +
                    entry("F32", "[0]", "[4,4]") + ",\"b\":" + entry("F32", "[1]", "[8,12]") + "}",
                12),
       {"\"a\" [0, 12)", "\"b\" [8, 12)", "overlap"}},
      // Metadata.
      {"MetadataNotObject",
       raw_file(R"({"__metadata__":"x"})", 0),
       {"\"__metadata__\" is a string", "object of strings"}},
      {"MetadataNumber",
       raw_file(R"({"__metadata__":{"step":12}})", 0),
       {"\"step\"", "an integer", "expected a string"}},
      {"MetadataNull", raw_file(R"({"__metadata__":{"step":null}})", 0), {"\"step\"", "null"}},
      {"MetadataObject", raw_file(R"({"__metadata__":{"step":{}}})", 0), {"\"step\"", "an object"}},
      {"MetadataDuplicateKey",
       raw_file(R"({"__metadata__":{"k":"a","k":"b"}})", 0),
       {"\"k\"", "appears twice"}},
  };
  return c;
}

class Corrupt : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(Corrupt, ParseHeaderRejects) {
  const CorruptCase& c = GetParam();
  std::vector<std::string> parts = c.parts;
  parts.push_back("ckpt/rank_00001.safetensors: ");
  expect_corrupt([&] { parse_header(c.bytes, c.bytes.size(), "ckpt/rank_00001.safetensors"); },
                 parts);
}

TEST_P(Corrupt, ReaderRejects) {
  const CorruptCase& c = GetParam();
  TempDir dir;
  const auto path = dir.path() / "rank_00001.safetensors";
  write_file(path, c.bytes);
  // The reader names the file by its path.
  std::vector<std::string> parts = {path.string() + ": "};
  for (std::string part : c.parts) {
    const std::string what = "ckpt/rank_00001.safetensors";
    if (const size_t at = part.find(what); at != std::string::npos) {
      part.replace(at, what.size(), path.string());
    }
    parts.push_back(part);
  }
  expect_corrupt([&] { Reader r(path); }, parts);
}

INSTANTIATE_TEST_SUITE_P(Rules, Corrupt, ::testing::ValuesIn(corrupt_cases()),
                         [](const ::testing::TestParamInfo<CorruptCase>& p) {
                           return p.param.name;
                         });

}  // namespace
}  // namespace zerodp::safetensors
