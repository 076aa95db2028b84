#include "checkpoint/store.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/files.h"
#include "core/sha256.h"

namespace zerodp::checkpoint {

namespace {

constexpr std::string_view kTempPrefix = ".tmp.";
constexpr std::string_view kReplacedPrefix = ".tmp.replaced.";
constexpr std::string_view kStepPrefix = "step_";
constexpr std::string_view kLatest = "latest";

// An int8-moment shard's moment tensors (format.h, Meta::int8_moments): codes over the range,
// scales and fp32 parts of whatever length the range's tensors give, m's and v's alike.
// Returns how many tensors it checked.
size_t expect_int8_moments(const safetensors::Reader& file, const std::string& unit,
                           std::span<const int64_t> range) {
  using safetensors::ElementType;
  (void)file.expect(tensor_name(unit, "adam_m8"), ElementType::kU8, range);
  (void)file.expect(tensor_name(unit, "adam_v8"), ElementType::kU8, range);
  for (const char* kind : {"adam_m8_scale", "adam_m"}) {
    const safetensors::TensorInfo* m = file.find(tensor_name(unit, kind));
    const std::string v_kind = std::string(kind) == "adam_m" ? "adam_v" : "adam_v8_scale";
    if (m == nullptr || m->shape.size() != 1) {
      throw CorruptData(fmt::format("{}: tensor \"{}\" is missing or not one-dimensional",
                                    file.path().string(), tensor_name(unit, kind)));
    }
    (void)file.expect(tensor_name(unit, kind), ElementType::kF32, m->shape);
    (void)file.expect(tensor_name(unit, v_kind), ElementType::kF32, m->shape);
  }
  return 6;
}

// What to try instead of a checkpoint `dir` found damaged: the newest committed one before it
// beside it, if any.
std::string earlier_checkpoint(const fs::path& dir, uint64_t step);

// Elements [first, first + n) of tensor `t` of `file` (a shard of the checkpoint `dir` at
// `step`) into `out`, then checked: CorruptData naming the file, the tensor, the element and
// its value when one is not what a run saves in a tensor of `kind`. One pass over what was
// just read: medium's 152 MB of states take 5-6.5 ms more than the copy from the page cache's
// 11-19 ms (pieces sized to stay in the cache between the two were no faster).
void read_checked(const safetensors::Reader& file, const safetensors::TensorInfo& t,
                  std::string_view kind, uint64_t first, std::span<std::byte> out,
                  const fs::path& dir, uint64_t step) {
  file.read(t, first, out);
  const SavedValues rule = saved_values(kind);
  const std::optional<BadValue> bad = first_bad_value(out, t.type, rule);
  if (!bad) return;
  throw CorruptData(fmt::format(
      "{}: tensor {} holds {} at element {}; a run saves only {} values there (a step with "
      "non-finite gradients is skipped, not saved), so this checkpoint is damaged though its "
      "checksums match; {}",
      file.path().string(), t.name, bad->value, first + bad->index, describe(rule),
      earlier_checkpoint(dir, step)));
}

[[noreturn]] void io_fail(std::string_view what, const fs::path& path) {
  throw IoError(fmt::format("{} {}: {}", what, path.string(), std::strerror(errno)));
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot open {}: {}", path.string(), std::strerror(errno)));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<uint64_t> parse_step_dir(std::string_view name) {
  if (!name.starts_with(kStepPrefix) || name.size() == kStepPrefix.size()) return std::nullopt;
  uint64_t step = 0;
  for (char c : name.substr(kStepPrefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + static_cast<uint64_t>(c - '0');
  }
  return step;
}

std::string earlier_checkpoint(const fs::path& dir, uint64_t step) {
  const fs::path root = dir.parent_path();
  std::optional<fs::path> before;
  try {
    for (const fs::path& p : list_checkpoints(root)) {
      const auto s = parse_step_dir(p.filename().string());
      if (s && *s < step) before = p;
    }
  } catch (const std::exception&) {
    // A directory that cannot be listed offers none: the damage is the news.
  }
  if (before) {
    return fmt::format(
        "continue from an earlier checkpoint, e.g. --resume {} (the newest before it)",
        before->string());
  }
  return fmt::format("{} holds no earlier checkpoint: restore this one from a copy, or start again",
                     root.empty() ? std::string(".") : root.string());
}

}  // namespace

void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_fail("cannot open for fsync", path);
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    io_fail("cannot fsync", path);
  }
  ::close(fd);
}

void write_file_atomically(const fs::path& path, std::string_view text) {
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_fail("cannot create", tmp);
  files::write_all("checkpoint", fd, tmp, text);
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    io_fail("cannot fsync", tmp);
  }
  if (::close(fd) != 0) io_fail("cannot close", tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) io_fail("cannot rename into", path);
  fsync_path(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

fs::path temp_dir(const fs::path& root, uint64_t step) {
  return root / (std::string(kTempPrefix) + step_dir_name(step));
}

fs::path step_dir(const fs::path& root, uint64_t step) { return root / step_dir_name(step); }

bool owned_by_store(std::string_view name) {
  return name == kLatest || name == std::string(kLatest) + ".tmp" || name == ".lock" ||
         name.starts_with(kStepPrefix) || name.starts_with(kTempPrefix);
}

void check_not_store_owned(std::string_view what, const fs::path& out, std::string_view root_what,
                           const fs::path& root) {
  const fs::path dir = files::final_target(root);
  // A dangling link still names where the output would land.
  const fs::path target = files::final_target(out);
  const fs::path rel = target.lexically_relative(dir);
  if (rel.empty() || *rel.begin() == ".." || *rel.begin() == ".") return;
  const std::string first = rel.begin()->string();
  if (!owned_by_store(first)) return;
  throw InvalidArgument(fmt::format(
      "{} '{}' would overwrite {} in {} '{}', which its checkpoints own (latest, .lock, "
      "step_* and .tmp.* are theirs); give the output another name there, or write it "
      "elsewhere",
      what, out.string(), first, root_what, root.string()));
}

int clean_leftovers(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return 0;
  // A crash while a step was being replaced: put the old copy back where `latest` looks.
  if (fs::exists(root / kLatest, ec)) {
    require_regular_file(root / kLatest, "checkpoint latest");
    std::string name = read_text(root / kLatest);
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
    const fs::path aside = root / (std::string(kReplacedPrefix) + name);
    if (parse_step_dir(name) && !fs::exists(root / name, ec) && fs::exists(aside, ec)) {
      if (::rename(aside.c_str(), (root / name).c_str()) != 0) io_fail("cannot restore", aside);
      fsync_path(root);
    }
  }
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(kTempPrefix) || name == std::string(kLatest) + ".tmp") {
      fs::remove_all(entry.path());
      ++removed;
    }
  }
  return removed;
}

std::vector<fs::path> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<uint64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root)) {
    const auto step = parse_step_dir(entry.path().filename().string());
    if (step && entry.is_directory() && fs::exists(entry.path() / "meta.json")) {
      found.emplace_back(*step, entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [step, path] : found) out.push_back(path);
  return out;
}

FileMeta write_history(const fs::path& temp, const std::vector<StepHistory>& steps) {
  const std::string text = history_to_jsonl(steps);
  write_file_atomically(temp / kHistoryFile, text);
  Crc32c crc;
  crc.update(text.data(), text.size());
  return {
      .name = std::string(kHistoryFile), .bytes = text.size(), .crc32c = crc.hex(), .sha256 = {}};
}

void commit(const fs::path& root, const fs::path& temp, const Meta& meta, int keep) {
  write_file_atomically(temp / "meta.json", to_json(meta));
  failpoint("meta-written", 0);
  fsync_path(temp);
  const fs::path final_dir = step_dir(root, meta.step);
  // The same step saved again (a continuation of an older checkpoint in the same
  // directory): the old copy moves aside first and is deleted only after the new one is
  // in place. A crash in between leaves `latest` naming a missing directory for a moment;
  // clean_leftovers() moves the old copy back.
  const fs::path aside = root / (std::string(kReplacedPrefix) + step_dir_name(meta.step));
  std::error_code ec;
  const bool replacing = fs::exists(final_dir, ec);
  if (replacing) {
    fs::remove_all(aside);
    if (::rename(final_dir.c_str(), aside.c_str()) != 0) io_fail("cannot move aside", final_dir);
  }
  if (::rename(temp.c_str(), final_dir.c_str()) != 0) io_fail("cannot rename into", final_dir);
  fsync_path(root);
  failpoint("renamed", 0);
  write_file_atomically(root / kLatest, step_dir_name(meta.step) + "\n");
  failpoint("latest-written", 0);
  if (replacing) fs::remove_all(aside);
  prune(root, keep, meta.step);
}

void prune(const fs::path& root, int keep, uint64_t newest) {
  if (keep <= 0) return;
  std::vector<fs::path> all = list_checkpoints(root);
  const size_t k = static_cast<size_t>(keep);
  for (size_t i = 0; i + k < all.size(); ++i) {
    if (all[i] != step_dir(root, newest)) fs::remove_all(all[i]);
  }
  fsync_path(root);
}

std::optional<fs::path> find_latest(const fs::path& root) {
  const fs::path latest = root / kLatest;
  std::error_code ec;
  if (!fs::exists(latest, ec)) return std::nullopt;
  require_regular_file(latest, "checkpoint latest");
  std::string name = read_text(latest);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  if (!parse_step_dir(name)) {
    throw CorruptData(fmt::format("{}: names \"{}\", not a step directory (step_NNNNNNNN)",
                                  latest.string(), name));
  }
  const fs::path dir = root / name;
  if (!fs::exists(dir / "meta.json", ec)) {
    throw CorruptData(
        fmt::format("{}: names {}, which holds no meta.json", latest.string(), dir.string()));
  }
  return dir;
}

fs::path resolve(const fs::path& path, std::string_view flag) {
  std::error_code ec;
  if (fs::exists(path / "meta.json", ec)) return path;
  if (fs::exists(path / kLatest, ec)) return *find_latest(path);
  if (!fs::exists(path, ec)) {
    throw InvalidArgument(fmt::format("{} {}: no such file or directory", flag, path.string()));
  }
  throw InvalidArgument(
      fmt::format("{} {}: neither a checkpoint (no meta.json) nor a checkpoint directory "
                  "(no latest); pass a step_NNNNNNNN directory or the --checkpoint-dir",
                  flag, path.string()));
}

void failpoint(std::string_view boundary, int rank) {
  const char* spec = std::getenv("ZERODP_FAILPOINT");
  if (spec == nullptr) return;
  std::string_view s(spec);
  const size_t colon = s.find(':');
  if (s.substr(0, colon) != boundary) return;
  if (colon != std::string_view::npos && s.substr(colon + 1) != std::to_string(rank)) return;
  ::raise(SIGKILL);
}

// --- reading --------------------------------------------------------------------------

Meta read_meta(const fs::path& dir) {
  const fs::path meta_path = dir / "meta.json";
  std::error_code ec;
  if (!fs::exists(meta_path, ec)) {
    throw CorruptData(fmt::format("{}: missing; {} is not a committed checkpoint",
                                  meta_path.string(), dir.string()));
  }
  require_regular_file(meta_path, "checkpoint meta.json");
  // meta.json grows with units and ranks, a few hundred bytes each; anything near this is
  // not one, and reading it whole must not be the way to exhaust memory.
  constexpr uint64_t kMaxMetaBytes = uint64_t{64} << 20;
  if (const uint64_t size = fs::file_size(meta_path); size > kMaxMetaBytes) {
    throw CorruptData(fmt::format("{}: {} bytes, over the {}-byte limit of a meta.json",
                                  meta_path.string(), size, kMaxMetaBytes));
  }
  return parse_meta(read_text(meta_path), meta_path.string());
}

Checkpoint::Checkpoint(const fs::path& dir, std::string_view this_host) : dir_(dir) {
  std::error_code ec;
  meta_ = read_meta(dir);
  // A file another host wrote to its own disk is not here by design.
  const auto elsewhere = [&](size_t i) {
    return !meta_.hosts.empty() && meta_.hosts[i] != this_host &&
           !fs::exists(dir / meta_.files[i].name, ec);
  };
  // Checksums first: nothing is parsed from a file whose bytes are not the ones committed.
  for (size_t i = 0; i < meta_.files.size(); ++i) {
    const FileMeta& f = meta_.files[i];
    const fs::path p = dir / f.name;
    if (elsewhere(i)) continue;
    if (!fs::exists(p, ec)) {
      throw CorruptData(
          fmt::format("{}: missing (meta.json lists it, {} bytes)", p.string(), f.bytes));
    }
    require_regular_file(p, f.name == kHistoryFile ? "checkpoint history" : "checkpoint shard");
    const uint64_t size = fs::file_size(p);
    if (size != f.bytes) {
      throw CorruptData(fmt::format("{}: {} bytes, meta.json says {} (truncated or replaced)",
                                    p.string(), size, f.bytes));
    }
    const bool crc = !f.crc32c.empty();
    const std::string digest = crc ? crc32c_file_hex(p) : sha256_file_hex(p);
    if (digest != (crc ? f.crc32c : f.sha256)) {
      throw CorruptData(
          fmt::format("{}: {} {} but meta.json says {} (corrupt, or a shard "
                      "of another checkpoint)",
                      p.string(), crc ? "crc32c" : "sha256", digest, crc ? f.crc32c : f.sha256));
    }
  }
  if (meta_.has_history() && !elsewhere(meta_.files.size() - 1)) {
    const fs::path p = dir / kHistoryFile;
    history_ = parse_history(read_text(p), p.string(), meta_.step);
  }
  const std::string params_type = meta_.precision == "bf16"   ? "BF16"
                                  : meta_.precision == "fp16" ? "F16"
                                                              : "F32";
  const auto ptype = *safetensors::parse_element_type(params_type);
  starts_.resize(meta_.units.size());
  for (int r = 0; r < meta_.world_size; ++r) {
    for (size_t u = 0; u < meta_.units.size(); ++u) {
      uint64_t start = 0;
      for (int q = 0; q < r; ++q) start += meta_.units[u].counts[static_cast<size_t>(q)];
      starts_[u].push_back(start);
    }
  }
  for (int f = 0; f < meta_.shard_files(); ++f) {
    const int r = f % meta_.world_size;
    const bool outer = meta_.islands > 1 && f < meta_.world_size;
    if (elsewhere(static_cast<size_t>(f))) {
      files_.emplace_back();
      continue;
    }
    files_.emplace_back(std::in_place, dir / meta_.files[static_cast<size_t>(f)].name);
    const safetensors::Reader& file = *files_.back();
    size_t expected_tensors = 0;
    for (size_t u = 0; u < meta_.units.size(); ++u) {
      const UnitMeta& unit = meta_.units[u];
      const int64_t count = static_cast<int64_t>(unit.counts[static_cast<size_t>(r)]);
      const std::vector<int64_t> shape{count};
      (void)file.expect(tensor_name(unit.name, "params"), ptype, shape);
      if (meta_.int8_moments) {
        expected_tensors += expect_int8_moments(file, unit.name, shape);
      } else {
        (void)file.expect(tensor_name(unit.name, "adam_m"), safetensors::ElementType::kF32, shape);
        (void)file.expect(tensor_name(unit.name, "adam_v"), safetensors::ElementType::kF32, shape);
        expected_tensors += 2;
      }
      ++expected_tensors;
      if (has_master()) {
        (void)file.expect(tensor_name(unit.name, "master"), safetensors::ElementType::kF32, shape);
        ++expected_tensors;
      }
      if (outer) {
        for (const char* kind : {"outer_params", "outer_momentum"}) {
          (void)file.expect(tensor_name(unit.name, kind), safetensors::ElementType::kF32, shape);
        }
        expected_tensors += 2;
        // The exchange in flight when it was saved (Streaming DiLoCo's --outer-delay).
        if (file.find(tensor_name(unit.name, "outer_pending")) != nullptr) {
          (void)file.expect(tensor_name(unit.name, "outer_pending"), safetensors::ElementType::kF32,
                            shape);
          ++expected_tensors;
        }
      }
    }
    if (file.header().tensors.size() != expected_tensors) {
      throw CorruptData(fmt::format("{}: holds {} tensors, meta.json describes {}",
                                    file.path().string(), file.header().tensors.size(),
                                    expected_tensors));
    }
  }
}

Checkpoint::~Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;

size_t Checkpoint::unit_index(std::string_view name) const {
  for (size_t u = 0; u < meta_.units.size(); ++u) {
    if (meta_.units[u].name == name) return u;
  }
  throw CorruptData(fmt::format("{}: has no unit \"{}\"", dir_.string(), name));
}

void Checkpoint::read(size_t unit, std::string_view kind, uint64_t first, std::span<std::byte> out,
                      int island) const {
  if (island < 0 || island >= meta_.islands) {
    throw InvalidArgument(
        fmt::format("checkpoint read: island {} of a checkpoint of {}", island, meta_.islands));
  }
  const UnitMeta& u = meta_.units.at(unit);
  const std::string name = tensor_name(u.name, kind);
  // The island's files (the outer state is only in island 0's).
  const auto from = files_.begin() + static_cast<std::ptrdiff_t>(island) * meta_.world_size;
  const auto to = from + meta_.world_size;
  const auto here = std::find_if(from, to, [](const auto& f) { return f.has_value(); });
  if (here == to) {
    throw CorruptData(fmt::format("{}: none of its shards is on this host", dir_.string()));
  }
  const safetensors::TensorInfo* probe = (*here)->find(name);
  if (probe == nullptr) {
    throw CorruptData(fmt::format("{}: no tensor \"{}\"", (*here)->path().string(), name));
  }
  const size_t esize = safetensors::element_size(probe->type);
  if (out.size() % esize != 0) {
    throw InvalidArgument(
        fmt::format("checkpoint read of {}: {} bytes is not a whole number of "
                    "{}-byte elements",
                    name, out.size(), esize));
  }
  const uint64_t count = out.size() / esize;
  if (first > u.numel || count > u.numel - first) {
    throw InvalidArgument(fmt::format("checkpoint read of {}: [{}, {}) is past its {} elements",
                                      name, first, first + count, u.numel));
  }
  const uint64_t end = first + count;
  const size_t n = static_cast<size_t>(meta_.world_size);
  for (size_t r = 0; r < n; ++r) {
    const uint64_t b = starts_[unit][r];
    const uint64_t e = b + u.counts[r];
    const uint64_t lo = std::max(b, first), hi = std::min(e, end);
    if (lo >= hi) continue;
    const size_t f = static_cast<size_t>(island) * n + r;
    if (!files_[f]) {
      throw CorruptData(fmt::format(
          "{}: {} is not on this host: host {} wrote it to its own disk (--checkpoint-storage "
          "node-local), and rank {}'s range of {} is in it. A node-local checkpoint resumes on "
          "the hosts that wrote it, with the same ranks on each; to resume elsewhere, copy "
          "every host's {} into one directory first (e.g. rsync -a HOST:{}/ {}/) and "
          "--resume from it",
          dir_.string(), meta_.files[f].name, meta_.hosts[f], f, u.name, dir_.filename().string(),
          dir_.string(), dir_.string()));
    }
    const safetensors::TensorInfo* t = files_[f]->find(name);
    read_checked(*files_[f], *t, kind, lo - b, out.subspan((lo - first) * esize, (hi - lo) * esize),
                 dir_, meta_.step);
  }
}

void Checkpoint::read_rank(int rank, size_t unit, std::string_view kind, uint64_t first,
                           std::span<std::byte> out, int island) const {
  const size_t f = static_cast<size_t>(island) * static_cast<size_t>(meta_.world_size) +
                   static_cast<size_t>(rank);
  const std::string name = tensor_name(meta_.units.at(unit).name, kind);
  if (f >= files_.size() || !files_[f]) {
    throw CorruptData(fmt::format("{}: rank {}'s shard is not on this host", dir_.string(), rank));
  }
  const safetensors::TensorInfo* t = files_[f]->find(name);
  if (t == nullptr) {
    throw CorruptData(fmt::format("{}: no tensor \"{}\"", files_[f]->path().string(), name));
  }
  read_checked(*files_[f], *t, kind, first, out, dir_, meta_.step);
}

uint64_t Checkpoint::length(int rank, size_t unit, std::string_view kind, int island) const {
  const size_t f = static_cast<size_t>(island) * static_cast<size_t>(meta_.world_size) +
                   static_cast<size_t>(rank);
  if (f >= files_.size() || !files_[f]) return 0;
  const safetensors::TensorInfo* t = files_[f]->find(tensor_name(meta_.units.at(unit).name, kind));
  uint64_t n = t != nullptr ? 1 : 0;
  if (t != nullptr) {
    for (int64_t d : t->shape) n *= static_cast<uint64_t>(d);
  }
  return n;
}

void Checkpoint::read_master(size_t unit, uint64_t first, std::span<float> out, int island) const {
  read(unit, has_master() ? "master" : "params", first, std::as_writable_bytes(out), island);
}

bool Checkpoint::holds(std::string_view kind) const {
  for (const auto& f : files_) {
    if (f) return f->find(tensor_name(meta_.units.at(0).name, kind)) != nullptr;
  }
  return false;
}

void Checkpoint::read_weights(size_t unit, uint64_t first, std::span<float> out) const {
  if (meta_.islands > 1) {
    read(unit, "outer_params", first, std::as_writable_bytes(out));
  } else {
    read_master(unit, first, out);
  }
}

}  // namespace zerodp::checkpoint
