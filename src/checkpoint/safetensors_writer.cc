// The Writer of safetensors.h.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_text.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "core/sha256.h"

namespace zerodp::safetensors {
namespace {

using detail::checked_bytes;
using detail::json_quoted;
using detail::shape_text;
using detail::store_le64;

void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError(fmt::format("{}: write of {} bytes failed: {}", path.string(),
                                bytes.size() - done, std::strerror(errno)));
    }
    if (n == 0) {
      throw IoError(fmt::format("{}: write accepted none of {} bytes (is the disk full?)",
                                path.string(), bytes.size() - done));
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writer

struct Writer::Impl {
  // Small writes are gathered to this size, so writing a model tensor by tensor (or a test
  // byte by byte) does not cost a system call each; larger ones go straight through.
  static constexpr size_t kBufferBytes = size_t{256} << 10;
  // WriteMode::kDirect: everything passes through an aligned buffer of this size, so that
  // every write but the last starts and ends on the file system's block.
  static constexpr size_t kDirectBytes = size_t{1} << 20;
  static constexpr size_t kDirectAlign = 4096;

  std::filesystem::path path;
  int fd = -1;
  Digest digest = Digest::kSha256;
  Sha256 sha;
  Crc32c crc;
  std::vector<std::string> names;
  std::vector<uint64_t> ends;  // data-section end offset of each tensor, in order
  uint64_t total = 0;          // data-section bytes
  uint64_t written = 0;        // of them
  uint64_t file_bytes = 0;     // the whole file: length, header, data
  std::vector<std::byte> buffer;
  std::string failure;  // the IoError that left the file incomplete
  bool finished = false;
  // kDirect while the descriptor has O_DIRECT: the aligned buffer and how much of it is full.
  struct FreeAligned {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, FreeAligned> aligned;
  size_t fill = 0;
  uint64_t in_place = 0;  // bytes written with O_DIRECT straight from the caller's memory

  static bool block_aligned(const std::byte* p) {
    return reinterpret_cast<uintptr_t>(p) % kDirectAlign == 0;
  }

  void put(std::span<const std::byte> bytes) {
    if (digest == Digest::kCrc32c) {
      crc.update(bytes);
    } else {
      sha.update(bytes);
    }
    while (!bytes.empty() && aligned) {
      // The file is at a block boundary (the buffer empty) and the caller's bytes start on
      // one in memory: their whole blocks go to the disk from where they are, uncopied.
      if (fill == 0 && block_aligned(bytes.data()) && bytes.size() >= kDirectAlign) {
        bytes =
            bytes.subspan(write_in_place(bytes.first(bytes.size() / kDirectAlign * kDirectAlign)));
        continue;
      }
      // Bytes that will start on a block in memory once the buffer reaches the file's next
      // block boundary fill it only that far (then it is flushed), so the rest goes in place.
      size_t n = std::min(bytes.size(), kDirectBytes - fill);
      const size_t to_block = (kDirectAlign - fill % kDirectAlign) % kDirectAlign;
      if (to_block != 0 && to_block < n && block_aligned(bytes.data() + to_block)) n = to_block;
      std::memcpy(aligned.get() + fill, bytes.data(), n);
      fill += n;
      bytes = bytes.subspan(n);
      if (fill == kDirectBytes || (n == to_block && !bytes.empty())) flush_direct();
    }
    if (bytes.empty()) return;
    if (buffer.size() + bytes.size() <= kBufferBytes) {
      buffer.insert(buffer.end(), bytes.begin(), bytes.end());
      return;
    }
    flush();
    if (bytes.size() >= kBufferBytes) {
      write_all(fd, bytes, path);
    } else {
      buffer.insert(buffer.end(), bytes.begin(), bytes.end());
    }
  }

  void flush() {
    if (aligned) flush_direct();
    write_all(fd, buffer, path);
    buffer.clear();
  }

  // `blocks` (whole blocks, block-aligned in memory) with O_DIRECT; returns how many bytes
  // were written. Short only where the file system refused O_DIRECT (EINVAL) or wrote part
  // of a block: the caller then leaves direct I/O and writes the rest buffered.
  size_t write_direct(std::span<const std::byte> blocks) {
    size_t done = 0;
    while (done < blocks.size()) {
      const ssize_t n = ::write(fd, blocks.data() + done, blocks.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EINVAL) {
        throw IoError(fmt::format("{}: write of {} bytes failed: {}", path.string(),
                                  blocks.size() - done, std::strerror(errno)));
      }
      if (n > 0) done += static_cast<size_t>(n);
      if (n <= 0 || static_cast<size_t>(n) % kDirectAlign != 0) break;
    }
    return done;
  }

  // The descriptor leaves O_DIRECT for good.
  void leave_direct() {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) {
      throw IoError(
          fmt::format("{}: cannot leave direct I/O: {}", path.string(), std::strerror(errno)));
    }
  }

  // The caller's whole blocks straight from its memory (the aligned buffer is empty); where
  // that stops short, the put loop writes the rest buffered.
  size_t write_in_place(std::span<const std::byte> blocks) {
    const size_t done = write_direct(blocks);
    in_place += done;
    if (done < blocks.size()) {
      leave_direct();
      aligned.reset();
    }
    return done;
  }

  // The aligned buffer's whole blocks with O_DIRECT; a partial block left (only at the end)
  // goes through the cache. A file system that refuses O_DIRECT at the write, or a short
  // write, ends direct writing: the rest is written buffered from where it stopped.
  void flush_direct() {
    const size_t whole = fill / kDirectAlign * kDirectAlign;
    const size_t done = write_direct({aligned.get(), whole});
    if (done == whole && done == fill) {
      fill = 0;
      return;
    }
    // The rest, buffered.
    leave_direct();
    const auto held = std::move(aligned);  // freed once the rest is written
    const std::span<const std::byte> rest(held.get() + done, fill - done);
    fill = 0;
    write_all(fd, rest, path);
  }

  void check_usable(std::string_view call) const {
    if (finished) {
      throw InvalidArgument(
          fmt::format("{}: {} after finish(); the file is complete", path.string(), call));
    }
    if (!failure.empty()) {
      throw IoError(fmt::format("{} (an earlier write failed; the file is incomplete)", failure));
    }
  }

  // The tensor that data-section byte `offset` belongs to.
  size_t tensor_at(uint64_t offset) const {
    return static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), offset) - ends.begin());
  }
};

namespace {

// The header a Writer writes for `tensors` and `metadata`: its text (padded), the data
// section's size and each tensor's end in it. Throws InvalidArgument naming `file`.
struct EncodedHeader {
  std::string text;
  uint64_t data_bytes = 0;
  std::vector<uint64_t> ends;
};

EncodedHeader encode_header(const std::string& file, const std::vector<TensorDecl>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  EncodedHeader h;
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDecl& t = tensors[i];
    if (t.name.empty()) {
      throw InvalidArgument(
          fmt::format("{}: tensor {} of {} has an empty name", file, i, tensors.size()));
    }
    if (t.name.starts_with("__")) {
      throw InvalidArgument(
          fmt::format("{}: tensor name {} starts with \"__\", which safetensors "
                      "reserves (\"__metadata__\"); rename it",
                      file, json_quoted(t.name)));
    }
    if (!seen.insert(t.name).second) {
      throw InvalidArgument(
          fmt::format("{}: tensor {} is declared twice", file, json_quoted(t.name)));
    }
    for (const int64_t d : t.shape) {
      if (d < 0) {
        throw InvalidArgument(fmt::format("{}: tensor {}: shape {} has a negative dimension", file,
                                          json_quoted(t.name), shape_text(t.shape)));
      }
    }
    const std::optional<uint64_t> bytes = checked_bytes(t.shape, element_size(t.type));
    if (!bytes || *bytes > std::numeric_limits<uint64_t>::max() - h.data_bytes) {
      throw InvalidArgument(fmt::format("{}: tensor {}: {} shape {} takes the file past 2^64 bytes",
                                        file, json_quoted(t.name), element_type_name(t.type),
                                        shape_text(t.shape)));
    }
    nlohmann::json entry = nlohmann::json::object();
    entry["dtype"] = element_type_name(t.type);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {h.data_bytes, h.data_bytes + *bytes};
    header[t.name] = std::move(entry);
    h.data_bytes += *bytes;
    h.ends.push_back(h.data_bytes);
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::type_error& e) {
    throw InvalidArgument(
        fmt::format("{}: a tensor name or metadata string is not valid UTF-8: {}", file, e.what()));
  }
  // As the reference implementation: spaces up to a multiple of 8, so that with the 8-byte
  // length in front the data section starts 8-aligned and can be mapped and used in place.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes) {
    throw InvalidArgument(
        fmt::format("{}: the header would be {} bytes, over the {}-byte limit "
                    "readers enforce; split the tensors over more files",
                    file, text.size(), kMaxHeaderBytes));
  }
  h.text = std::move(text);
  return h;
}

}  // namespace

uint64_t header_bytes(const std::vector<TensorDecl>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  return 8 + encode_header("(header)", tensors, metadata).text.size();
}

Writer::Writer(const std::filesystem::path& path, std::vector<TensorDecl> tensors,
               const std::map<std::string, std::string>& metadata, WriteMode mode, Digest digest) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->digest = digest;
  const std::string file = path.string();

  EncodedHeader h = encode_header(file, tensors, metadata);
  const std::string text = std::move(h.text);
  impl->total = h.data_bytes;
  impl->ends = std::move(h.ends);
  impl->file_bytes = 8 + text.size() + impl->total;
  impl->names.reserve(tensors.size());
  for (TensorDecl& t : tensors) impl->names.push_back(std::move(t.name));

  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (mode == WriteMode::kDirect) {
    impl->fd = ::open(path.c_str(), kFlags | O_DIRECT, 0644);
    if (impl->fd >= 0) {
      impl->aligned.reset(
          static_cast<std::byte*>(std::aligned_alloc(Impl::kDirectAlign, Impl::kDirectBytes)));
      if (!impl->aligned) {
        ::close(impl->fd);
        throw std::bad_alloc();
      }
    }
  }
  // Buffered, or a file system that refuses O_DIRECT at the open (EINVAL).
  if (impl->fd < 0) impl->fd = ::open(path.c_str(), kFlags, 0644);
  if (impl->fd < 0) {
    throw IoError(fmt::format("{}: cannot open for writing: {}", file, std::strerror(errno)));
  }
  try {
    impl->buffer.reserve(Impl::kBufferBytes);
    impl->put(store_le64(text.size()));
    impl->put(std::as_bytes(std::span(text)));
  } catch (...) {
    ::close(impl->fd);
    throw;
  }
  impl_ = impl.release();
}

Writer::~Writer() {
  if (impl_->fd >= 0) {
    // What was written reaches the file, so an incomplete one shows how far it got.
    if (impl_->failure.empty()) {
      try {
        impl_->flush();
      } catch (const IoError&) {
      }
    }
    ::close(impl_->fd);
  }
  delete impl_;
}

void Writer::write(std::span<const std::byte> bytes) {
  Impl& w = *impl_;
  w.check_usable("write()");
  const uint64_t left = w.total - w.written;
  if (bytes.size() > left) {
    const std::string last = w.names.empty() ? "(none declared)" : json_quoted(w.names.back());
    throw InvalidArgument(
        fmt::format("{}: write of {} bytes passes the end of the last tensor {} "
                    "by {} (only {} of the {} data bytes were left)",
                    w.path.string(), bytes.size(), last, bytes.size() - left, left, w.total));
  }
  try {
    w.put(bytes);
  } catch (const IoError& e) {
    w.failure = e.what();
    throw;
  }
  w.written += bytes.size();
}

uint64_t Writer::file_bytes() const { return impl_->file_bytes; }
uint64_t Writer::bytes_in_place() const { return impl_->in_place; }
uint64_t Writer::header_bytes() const { return impl_->file_bytes - impl_->total; }

std::string Writer::finish() {
  Impl& w = *impl_;
  w.check_usable("finish()");
  if (w.written < w.total) {
    const size_t i = w.tensor_at(w.written);
    const uint64_t begin = i == 0 ? 0 : w.ends[i - 1];
    throw InvalidArgument(
        fmt::format("{}: finish() with {} of {} data bytes unwritten: tensor {} "
                    "has {} of its {} bytes",
                    w.path.string(), w.total - w.written, w.total, json_quoted(w.names[i]),
                    w.written - begin, w.ends[i] - begin));
  }
  try {
    w.flush();
    while (::fsync(w.fd) != 0) {
      if (errno == EINTR) continue;
      // A device or FIFO written in place (--out /dev/null) has nothing to make durable.
      struct stat st {};
      if (errno == EINVAL && ::fstat(w.fd, &st) == 0 && !S_ISREG(st.st_mode)) break;
      throw IoError(fmt::format("{}: fsync failed: {}", w.path.string(), std::strerror(errno)));
    }
  } catch (const IoError& e) {
    w.failure = e.what();
    throw;
  }
  // Linux releases the descriptor even when close fails, so it is never retried.
  const int rc = ::close(w.fd);
  w.fd = -1;
  if (rc != 0) {
    w.failure = fmt::format("{}: close failed: {}", w.path.string(), std::strerror(errno));
    throw IoError(w.failure);
  }
  w.finished = true;
  return w.digest == Digest::kCrc32c ? w.crc.hex() : w.sha.hex_digest();
}

}  // namespace zerodp::safetensors
