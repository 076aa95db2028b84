// initial_weights.h is the contract.
#include "train/initial_weights.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/consolidate.h"
#include "checkpoint/safetensors.h"
#include "core/crc32c.h"
#include "core/error.h"
#include "core/files.h"
#include "core/sha256.h"
#include "tensor/dtype.h"
#include "train/checkpoint_resume.h"
#include "train/flat.h"
#include "train/hf_layout.h"
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
  CheckedFile(const InitDigest::File& digest, uint64_t data_start)
      : path_(digest.path), digest_(digest) {
    const std::filesystem::path& path = path_;
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
  const InitDigest::File& digest_;
  int fd_ = -1;
  std::vector<std::byte> block_;
  uint64_t loaded_ = UINT64_MAX;
};

// The file's sha256 and block CRCs, in one pass over it.
InitDigest::File digest_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw IoError(fmt::format("--init-from {}: cannot open for reading: {}", path.string(),
                              std::strerror(errno)));
  }
  InitDigest::File d;
  d.path = path;
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

// The files of a checked source, opened: each one's header and its checked reads. The
// digest comes first, so a header parsed here is one the digest covers (CheckedFile reads
// it again against the block CRCs).
class OpenFiles {
 public:
  explicit OpenFiles(const InitDigest& d) {
    for (const InitDigest::File& f : d.files) {
      readers_.emplace_back(f.path);
      bytes_.push_back(std::make_unique<CheckedFile>(f, readers_.back().header().data_start));
    }
  }
  const st::Reader& reader(size_t f) const { return readers_[f]; }
  CheckedFile& bytes(size_t f) { return *bytes_[f]; }

 private:
  std::vector<st::Reader> readers_;
  std::vector<std::unique_ptr<CheckedFile>> bytes_;
};

// A unit's flat elements, read from wherever the digest placed its tensors, widened to fp32.
class UnitReader {
 public:
  UnitReader(OpenFiles& files, const InitDigest& digest, const Unit& unit)
      : files_(files), digest_(digest), unit_(unit) {}

  // Elements [first, first + out.size()) of the unit's flat buffer into `out`.
  void read(size_t first, std::span<float> out) {
    const size_t end = first + out.size();
    for (const TensorSpec& t : unit_.tensors()) {
      const size_t lo = std::max(first, t.offset), hi = std::min(end, t.offset + t.numel);
      if (lo >= hi) continue;
      const InitDigest::Source& src = digest_.tensors.at(t.name);
      const st::TensorInfo* found = files_.reader(src.file).find(src.name);
      // Checked before training; a file replaced since is caught here.
      if (found == nullptr || found->numel() != t.numel || !widenable(found->type)) {
        throw CorruptData(fmt::format("--init-from {}: tensor {} changed since it was checked",
                                      digest_.files[src.file].path.string(), src.name));
      }
      std::span<float> into = out.subspan(lo - first, hi - lo);
      if (src.transposed) {
        read_transposed(src.file, *found, t, lo - t.offset, into);
      } else {
        read_run(src.file, *found, lo - t.offset, into);
      }
    }
  }

 private:
  // The file's elements [first, first + out.size()) of `info`, widened.
  void read_run(size_t f, const st::TensorInfo& info, uint64_t first, std::span<float> out) {
    const uint64_t offset =
        files_.reader(f).header().data_start + info.begin + first * st::element_size(info.type);
    if (info.type == st::ElementType::kF32) {
      files_.bytes(f).read(offset, std::as_writable_bytes(out));
      return;
    }
    raw_.resize(out.size() * st::element_size(info.type));
    files_.bytes(f).read(offset, raw_);
    if (info.type == st::ElementType::kBF16) {
      convert(std::span(reinterpret_cast<const BFloat16*>(raw_.data()), out.size()), out);
    } else {
      convert(std::span(reinterpret_cast<const Float16*>(raw_.data()), out.size()), out);
    }
  }

  // The model's (R, K) tensor from the file's (K, R): the rows [r0, r1) that elements
  // [a, a + out.size()) fall in are gathered a tile of rows at a time, one run of the file's
  // per column, in the file's order, so each 64 KiB block is checked once per tile and the
  // memory held is a tile's, not the tensor's.
  void read_transposed(size_t f, const st::TensorInfo& info, const TensorSpec& t, size_t a,
                       std::span<float> out) {
    constexpr size_t kTile = size_t{1} << 22;
    const size_t R = static_cast<size_t>(t.shape[0]), K = static_cast<size_t>(t.shape[1]);
    const size_t b = a + out.size();
    const size_t r_end = (b + K - 1) / K;
    const size_t rows = std::max<size_t>(1, kTile / K);
    for (size_t rs = a / K; rs < r_end; rs += rows) {
      const size_t re = std::min(r_end, rs + rows), nr = re - rs;
      tile_.resize(nr * K);
      for (size_t k = 0; k < K; ++k) {
        read_run(f, info, k * R + rs, std::span(tile_).subspan(k * nr, nr));
      }
      for (size_t r = rs; r < re; ++r) {
        const size_t k0 = r * K < a ? a - r * K : 0, k1 = std::min(K, b - r * K);
        for (size_t k = k0; k < k1; ++k) out[r * K + k - a] = tile_[k * nr + (r - rs)];
      }
    }
  }

  OpenFiles& files_;
  const InitDigest& digest_;
  const Unit& unit_;
  std::vector<std::byte> raw_;
  std::vector<float> tile_;
};

// A small JSON file of the source (config.json, the index), read whole: its value and the
// sha256 of the bytes it was parsed from.
std::pair<nlohmann::json, std::string> read_json(const std::filesystem::path& path,
                                                 uint64_t max_bytes) {
  const std::string what = fmt::format("--init-from {}", path.string());
  const uint64_t size = files::require_regular_input(what, path);
  if (size > max_bytes) {
    throw InvalidArgument(fmt::format("{}: {} bytes; a Hugging Face {} is far smaller", what, size,
                                      path.filename().string()));
  }
  std::string text;
  files::read_in_chunks(what, path, [&](std::span<const std::byte> b) {
    text.append(reinterpret_cast<const char*>(b.data()), b.size());
  });
  Sha256 sha;
  sha.update(std::as_bytes(std::span(text)));
  try {
    return {nlohmann::json::parse(text), sha.hex_digest()};
  } catch (const nlohmann::json::parse_error& e) {
    throw InvalidArgument(fmt::format("{}: not JSON ({})", what, e.what()));
  }
}

hf::HfConfig read_hf_config(const std::filesystem::path& dir, std::string* sha256) {
  const std::filesystem::path path = dir / "config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw InvalidArgument(fmt::format(
        "--init-from {} is a directory without config.json; give a Hugging Face model directory "
        "(config.json and model.safetensors, or its index and shards) or a safetensors file",
        dir.string()));
  }
  auto [json, sha] = read_json(path, uint64_t{1} << 20);
  if (sha256 != nullptr) *sha256 = sha;
  return hf::read_config(json, fmt::format("--init-from {}", path.string()));
}

// The shards an index names, in the order first named, each tensor's file checked later
// against the shards' own headers.
std::vector<std::string> index_shards(const nlohmann::json& index, const std::string& what,
                                      std::map<std::string, std::string>& placed) {
  const auto map = index.is_object() ? index.find("weight_map") : index.end();
  if (!index.is_object() || map == index.end() || !map->is_object()) {
    throw InvalidArgument(fmt::format("{}: has no \"weight_map\" object", what));
  }
  std::vector<std::string> shards;
  for (const auto& [name, file] : map->items()) {
    const std::string f = file.is_string() ? file.get<std::string>() : "";
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      throw InvalidArgument(fmt::format(
          "{}: \"weight_map\" places {} in {}; give file names in the index's directory", what,
          name, file.dump()));
    }
    placed[name] = f;
    if (std::find(shards.begin(), shards.end(), f) == shards.end()) shards.push_back(f);
  }
  return shards;
}

// What --init-from names: its files digested, its layout decided, and (a directory) its
// config.json read. `listing` gets sha256sum's lines of every file read.
struct Opened {
  InitDigest digest;
  bool tied = false;
  std::map<std::string, std::string> placed;  // an index's weight_map
};

Opened open_source(const std::filesystem::path& from, std::string_view kind) {
  Opened o;
  std::string listing;
  const auto list = [&](const std::string& sha, const std::string& name) {
    listing += fmt::format("{}  {}\n", sha, name);
  };
  std::error_code ec;
  if (std::filesystem::is_directory(from, ec)) {
    o.digest.hugging_face = true;
    std::string config_sha;
    const hf::HfConfig config = read_hf_config(from, &config_sha);
    list(config_sha, "config.json");
    if (config.kind != kind) {
      throw InvalidArgument(fmt::format(
          "--init-from {}: config.json describes a {}, and this run trains a {}; leave --model "
          "out to take the file's",
          from.string(), config.kind, kind));
    }
    o.tied = config.tied;
    std::vector<std::string> shards{"model.safetensors"};
    if (const auto index = from / "model.safetensors.index.json";
        std::filesystem::exists(index, ec)) {
      auto [json, sha] = read_json(index, uint64_t{256} << 20);
      list(sha, index.filename().string());
      shards = index_shards(json, fmt::format("--init-from {}", index.string()), o.placed);
    } else if (!std::filesystem::exists(from / shards[0], ec)) {
      throw InvalidArgument(fmt::format(
          "--init-from {}: holds neither model.safetensors nor model.safetensors.index.json",
          from.string()));
    }
    for (const std::string& s : shards) {
      if (!std::filesystem::exists(from / s, ec) && !o.placed.empty()) {
        throw InvalidArgument(fmt::format(
            "--init-from {}: model.safetensors.index.json names {}, which is not there; give "
            "the whole directory the index came with",
            from.string(), s));
      }
      files::require_regular_input(fmt::format("--init-from {}", (from / s).string()), from / s);
      o.digest.files.push_back(digest_file(from / s));
      list(o.digest.files.back().sha256, s);
    }
    Sha256 sha;
    sha.update(std::as_bytes(std::span(listing)));
    o.digest.sha256 = sha.hex_digest();
    return o;
  }
  o.digest.files.push_back(digest_file(from));
  o.digest.sha256 = o.digest.files[0].sha256;
  const st::Reader reader(from);
  const auto format = reader.header().metadata.find("format");
  o.digest.hugging_face =
      format != reader.header().metadata.end() && format->second != checkpoint::kExportFormat;
  o.tied = o.digest.hugging_face && reader.find("lm_head.weight") == nullptr;
  return o;
}

std::string shape_text(const std::vector<int64_t>& s) {
  return fmt::format("{}", fmt::join(s, ", "));
}

// The files' values over the ranges this rank holds of one island's states.
void load_island_weights(ShardedState& state, StateStore& store, OpenFiles& files,
                         const InitDigest& digest) {
  const DType dtype = state.dtype();
  std::vector<float> tmp;
  for (size_t i = 0; i < state.units().size(); ++i) {
    UnitState& u = state.units()[i];
    UnitReader values(files, digest, *u.unit);
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

// Every tensor of every file, by name: its file and its header entry, each in the file the
// index placed it in (InvalidArgument otherwise, or for a name held twice).
using Present = std::map<std::string, std::pair<size_t, const st::TensorInfo*>>;

Present tensors_present(Opened& o, OpenFiles& files, const std::filesystem::path& from) {
  const InitDigest& d = o.digest;
  Present present;
  for (size_t f = 0; f < d.files.size(); ++f) {
    const std::string where = fmt::format("--init-from {}", d.files[f].path.string());
    for (const st::TensorInfo& info : files.reader(f).header().tensors) {
      const std::string file = d.files[f].path.filename().string();
      if (!o.placed.empty() && o.placed[info.name] != file) {
        throw InvalidArgument(fmt::format(
            "{}: holds {}, which model.safetensors.index.json places {}", where, info.name,
            o.placed[info.name].empty() ? "nowhere" : "in " + o.placed[info.name]));
      }
      if (!present.emplace(info.name, std::pair{f, &info}).second) {
        throw InvalidArgument(fmt::format("{}: holds {} a second time", where, info.name));
      }
    }
  }
  for (const auto& [name, file] : o.placed) {
    if (present.count(name) == 0) {
      throw InvalidArgument(fmt::format(
          "--init-from {}: model.safetensors.index.json places {} in {}, which does not hold it",
          from.string(), name, file));
    }
  }
  return present;
}

}  // namespace

hf::HfConfig hf_model_of(const std::filesystem::path& dir) { return read_hf_config(dir, nullptr); }

std::vector<std::vector<float>> read_initial_weights(const Model& model, const InitDigest& digest) {
  OpenFiles files(digest);
  std::vector<std::vector<float>> weights;
  for (const auto& unit : model) {
    UnitReader read(files, digest, *unit);
    read.read(0, weights.emplace_back(unit->numel()));
  }
  return weights;
}

void adopt_init_model(TrainConfig& cfg) {
  std::error_code ec;
  if (cfg.init_from.empty() || !cfg.given || !std::filesystem::is_directory(cfg.init_from, ec)) {
    return;
  }
  const hf::HfConfig config = read_hf_config(cfg.init_from, nullptr);
  adopt_model_fields(cfg, {.kind = config.kind,
                           .shape = config.shape,
                           .what = (std::filesystem::path(cfg.init_from) / "config.json").string(),
                           .flag = "--init-from",
                           .source = "config.json",
                           .key_prefix = "",
                           .remedy = "take the file's",
                           .free_key = config.kind == kLlamaKind ? "seq_len" : ""});
}

InitDigest check_initial_weights(const Model& model, const std::string& model_name,
                                 std::string_view model_kind, const std::filesystem::path& from) {
  std::error_code ec;
  if (!std::filesystem::exists(from, ec)) {
    throw InvalidArgument(fmt::format(
        "--init-from {} {}; give a safetensors file of the model's weights (zerodp export "
        "writes one) or a Hugging Face model directory",
        from.string(),
        ec.value() == ELOOP ? "is a loop of symbolic links (each names the next, and none a "
                              "file)"
                            : "does not exist"));
  }
  Opened o = open_source(from, model_kind);
  InitDigest& d = o.digest;
  if (d.hugging_face && !hf::has_layout(model_kind)) {
    throw InvalidArgument(fmt::format(
        "--init-from {}: a file in Hugging Face's layout, and {} has none (the gpt and the "
        "llama have one)",
        from.string(), model_name));
  }
  OpenFiles files(d);
  const Present present = tensors_present(o, files, from);
  const std::string where = fmt::format("--init-from {}", from.string());
  std::set<std::string> used;
  for (const auto& unit : model) {
    for (const TensorSpec& t : unit->tensors()) {
      const hf::HfSource source = d.hugging_face ? hf::import_source(model_kind, t.name, o.tied)
                                                 : hf::HfSource{{t.name}, false};
      const auto it = std::find_if(source.names.begin(), source.names.end(),
                                   [&](const std::string& n) { return present.count(n) > 0; });
      std::vector<int64_t> want = t.shape;
      if (source.transposed) std::reverse(want.begin(), want.end());
      if (it == source.names.end()) {
        throw InvalidArgument(fmt::format(
            "{}: the files have no tensor {} [{}], which {} needs ({}); give weights of this "
            "model or the model flags that match them",
            where, source.names.front(), shape_text(want), model_name, t.name));
      }
      const auto [f, info] = present.at(*it);
      if (info->shape != want) {
        throw InvalidArgument(fmt::format(
            "{}: tensor {} is [{}] in the file, [{}] in {}; give the model flags that match the "
            "file",
            where, *it, shape_text(info->shape), shape_text(want), model_name));
      }
      if (!widenable(info->type)) {
        throw InvalidArgument(fmt::format("{}: tensor {} is {}; use F32, BF16 or F16 weights",
                                          where, *it, st::element_type_name(info->type)));
      }
      d.tensors[t.name] = {f, *it, source.transposed};
      used.insert(*it);
    }
  }
  for (const auto& [name, at] : present) {
    if (used.count(name) > 0) continue;
    if (d.hugging_face && hf::skipped_on_import(model_kind, name, o.tied)) continue;
    throw InvalidArgument(fmt::format(
        "{}: the file holds {} [{}], which {} does not have; give weights of this model only",
        where, name, shape_text(at.second->shape), model_name));
  }
  // Every value finite: a NaN or an infinity would train into NaN losses without a word.
  std::vector<float> values;
  for (const auto& unit : model) {
    UnitReader read(files, d, *unit);
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
                                        where, d.tensors.at(t->name).name, *bad, i - t->offset));
    }
  }
  return d;
}

void load_initial_weights(HeldIslands& islands, const InitDigest& digest) {
  OpenFiles files(digest);
  islands.for_each(
      [&](int) { load_island_weights(islands.state(), islands.store(), files, digest); });
}

}  // namespace zerodp
