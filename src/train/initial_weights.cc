// initial_weights.h is the contract.
#include "train/initial_weights.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "checkpoint/safetensors.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "core/sha256.h"
#include "tensor/dtype.h"
#include "train/flat.h"
#include "train/state_store.h"

namespace zerodp {
namespace {

namespace st = safetensors;

bool widenable(st::ElementType t) {
  return t == st::ElementType::kF32 || t == st::ElementType::kBF16 || t == st::ElementType::kF16;
}

// The file read in whole blocks, each compared with the digest's CRC before a byte of it
// is used; the last block is kept, since a rank's pieces come in file order.
class CheckedFile {
 public:
  CheckedFile(const std::filesystem::path& path, const InitDigest& digest, uint64_t data_start)
      : path_(path), digest_(digest) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) {
      throw IoError(fmt::format("--init-from {}: cannot open for reading: {}", path.string(),
                                std::strerror(errno)));
    }
    // The header the tensors' offsets came from is checked too.
    std::vector<std::byte> header(data_start);
    read(0, header);
  }
  ~CheckedFile() { ::close(fd_); }
  CheckedFile(const CheckedFile&) = delete;
  CheckedFile& operator=(const CheckedFile&) = delete;

  void read(uint64_t offset, std::span<std::byte> out) {
    while (!out.empty()) {
      const uint64_t b = offset / InitDigest::kBlock;
      load(b);
      const uint64_t in = offset - b * InitDigest::kBlock;
      const size_t n = std::min<size_t>(out.size(), block_.size() - in);
      std::memcpy(out.data(), block_.data() + in, n);
      out = out.subspan(n);
      offset += n;
    }
  }

 private:
  void load(uint64_t b) {
    if (b == loaded_) return;
    const uint64_t at = b * InitDigest::kBlock;
    if (b >= digest_.block_crc.size()) changed(at);
    block_.resize(std::min(InitDigest::kBlock, digest_.size - at));
    size_t got = 0;
    while (got < block_.size()) {
      const ssize_t n =
          ::pread(fd_, block_.data() + got, block_.size() - got, static_cast<off_t>(at + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        throw IoError(
            fmt::format("--init-from {}: cannot read: {}", path_.string(), std::strerror(errno)));
      }
      if (n == 0) changed(at);
      got += static_cast<size_t>(n);
    }
    if (crc32c(block_) != digest_.block_crc[b]) changed(at);
    loaded_ = b;
  }

  [[noreturn]] void changed(uint64_t at) const {
    throw CorruptData(fmt::format(
        "--init-from {}: the file changed while it was read (its bytes from offset {} are not "
        "those it held when checked and hashed); let whatever writes it finish, then start "
        "again",
        path_.string(), at));
  }

  std::filesystem::path path_;
  const InitDigest& digest_;
  int fd_ = -1;
  std::vector<std::byte> block_;
  uint64_t loaded_ = UINT64_MAX;
};

// The file's sha256 and block CRCs, in one pass over it.
InitDigest digest_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw IoError(fmt::format("--init-from {}: cannot open for reading: {}", path.string(),
                              std::strerror(errno)));
  }
  InitDigest d;
  Sha256 sha;
  std::vector<std::byte> block(InitDigest::kBlock);
  for (;;) {
    size_t got = 0;
    while (got < block.size()) {
      const ssize_t n = ::read(fd, block.data() + got, block.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        ::close(fd);
        throw IoError(
            fmt::format("--init-from {}: cannot read: {}", path.string(), std::strerror(e)));
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    if (got == 0) break;
    const std::span<const std::byte> bytes(block.data(), got);
    sha.update(bytes);
    d.block_crc.push_back(crc32c(bytes));
    d.size += got;
    if (got < block.size()) break;
  }
  ::close(fd);
  d.sha256 = sha.hex_digest();
  return d;
}

// A unit's flat elements, read from the file's tensors and widened to fp32.
class UnitReader {
 public:
  UnitReader(const st::Reader& file, CheckedFile& bytes, const Unit& unit)
      : file_(file), bytes_(bytes), unit_(unit) {}

  // Elements [first, first + out.size()) of the unit's flat buffer into `out`.
  void read(size_t first, std::span<float> out) {
    const size_t end = first + out.size();
    for (const TensorSpec& t : unit_.tensors()) {
      const size_t lo = std::max(first, t.offset), hi = std::min(end, t.offset + t.numel);
      if (lo >= hi) continue;
      const st::TensorInfo* found = file_.find(t.name);
      // Checked before training; a file replaced since is caught here.
      if (found == nullptr || found->numel() != t.numel || !widenable(found->type)) {
        throw CorruptData(fmt::format("--init-from {}: tensor {} changed since it was checked",
                                      file_.path().string(), t.name));
      }
      const st::TensorInfo& info = *found;
      std::span<float> into = out.subspan(lo - first, hi - lo);
      const size_t at = lo - t.offset;
      const uint64_t offset =
          file_.header().data_start + info.begin + at * st::element_size(info.type);
      if (info.type == st::ElementType::kF32) {
        bytes_.read(offset, std::as_writable_bytes(into));
        continue;
      }
      raw_.resize((hi - lo) * st::element_size(info.type));
      bytes_.read(offset, raw_);
      if (info.type == st::ElementType::kBF16) {
        convert(std::span(reinterpret_cast<const BFloat16*>(raw_.data()), hi - lo), into);
      } else {
        convert(std::span(reinterpret_cast<const Float16*>(raw_.data()), hi - lo), into);
      }
    }
  }

 private:
  const st::Reader& file_;
  CheckedFile& bytes_;
  const Unit& unit_;
  std::vector<std::byte> raw_;
};

}  // namespace

InitDigest check_initial_weights(const Model& model, const std::string& model_name,
                                 const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    throw InvalidArgument(fmt::format(
        "--init-from {} {}; give a safetensors file of the model's weights (zerodp export "
        "writes one)",
        file.string(),
        ec.value() == ELOOP ? "is a loop of symbolic links (each names the next, and none a "
                              "file)"
                            : "does not exist"));
  }
  const st::Reader reader(file);
  const InitDigest digest = digest_file(file);
  CheckedFile bytes(file, digest, reader.header().data_start);
  const std::string where = fmt::format("--init-from {}", file.string());
  std::set<std::string_view> wanted;
  for (const auto& unit : model) {
    for (const TensorSpec& t : unit->tensors()) {
      wanted.insert(t.name);
      const st::TensorInfo* info = reader.find(t.name);
      if (info == nullptr) {
        throw InvalidArgument(fmt::format(
            "{}: the file has no tensor {} [{}], which {} needs; give weights of this model "
            "(zerodp export writes them) or the model flags that match the file",
            where, t.name, fmt::join(t.shape, ", "), model_name));
      }
      if (info->shape != t.shape) {
        throw InvalidArgument(fmt::format(
            "{}: tensor {} is [{}] in the file, [{}] in {}; give the model flags that match the "
            "file",
            where, t.name, fmt::join(info->shape, ", "), fmt::join(t.shape, ", "), model_name));
      }
      if (!widenable(info->type)) {
        throw InvalidArgument(fmt::format("{}: tensor {} is {}; use F32, BF16 or F16 weights",
                                          where, t.name, st::element_type_name(info->type)));
      }
    }
  }
  // Every value finite: a NaN or an infinity would train into NaN losses without a word.
  std::vector<float> values;
  for (const auto& unit : model) {
    UnitReader read(reader, bytes, *unit);
    constexpr size_t kChunk = size_t{1} << 20;
    for (size_t at = 0; at < unit->numel(); at += kChunk) {
      values.resize(std::min(kChunk, unit->numel() - at));
      read.read(at, values);
      const auto bad =
          std::find_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
      if (bad == values.end()) continue;
      const size_t i = at + static_cast<size_t>(bad - values.begin());
      const auto t = std::find_if(unit->tensors().begin(), unit->tensors().end(),
                                  [i](const TensorSpec& x) { return i < x.offset + x.numel; });
      throw InvalidArgument(fmt::format("{}: tensor {} holds {} at element {}; give finite weights",
                                        where, t->name, *bad, i - t->offset));
    }
  }
  for (const st::TensorInfo& info : reader.header().tensors) {
    if (wanted.count(info.name) == 0) {
      throw InvalidArgument(fmt::format(
          "{}: the file holds {} [{}], which {} does not have; give weights of this model "
          "only (tensors under the names zerodp export writes)",
          where, info.name, fmt::join(info.shape, ", "), model_name));
    }
  }
  return digest;
}

void load_initial_weights(RankTrainer& trainer, const std::filesystem::path& file,
                          const InitDigest& digest) {
  const st::Reader reader(file);
  CheckedFile bytes(file, digest, reader.header().data_start);
  ShardedState& state = trainer.state();
  StateStore& store = trainer.store();
  const DType dtype = state.dtype();
  std::vector<float> tmp;
  for (size_t i = 0; i < state.units().size(); ++i) {
    UnitState& u = state.units()[i];
    UnitReader values(reader, bytes, *u.unit);
    const Range held = u.held;
    if (held == u.opt_range) {
      // The parameters it holds are those it updates, wherever the store keeps them.
      const StateStore::Job job{i, {0, held.count()}, StateStore::kParams};
      store.stream(std::span(&job, 1), StateStore::Access::kWrite, [&](StateStore::Piece& p) {
        tmp.resize(p.count);
        values.read(held.begin + p.begin, tmp);
        narrow(tmp, p.params, dtype, 0);
      });
    } else {
      tmp.resize(held.count());
      values.read(held.begin, tmp);
      narrow(tmp, u.params.data(), dtype, 0);
    }
    if (state.fp32()) continue;  // the parameters are the master
    const StateStore::Job job{i, {0, u.opt_range.count()}, StateStore::kMaster};
    store.stream(std::span(&job, 1), StateStore::Access::kWrite,
                 [&](StateStore::Piece& p) { values.read(u.opt_range.begin + p.begin, p.master); });
  }
}

}  // namespace zerodp
