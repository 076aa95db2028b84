#include "checkpoint/hf_export.h"

#include <algorithm>
#include <optional>
#include <set>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "checkpoint/store.h"
#include "core/error.h"
#include "core/files.h"
#include "tensor/dtype.h"

namespace zerodp::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kConfigFile = "config.json";
constexpr std::string_view kSingleFile = "model.safetensors";
constexpr std::string_view kIndexFile = "model.safetensors.index.json";
constexpr std::string_view kTokenizerFile = "tokenizer.model";
constexpr std::string_view kExportFiles =
    "config.json, model.safetensors, model-NNNNN-of-NNNNN.safetensors, "
    "model.safetensors.index.json, tokenizer.model";

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "model-00001-of-00003.safetensors": two numbers of at least 5 digits (HF's {:05d}).
bool is_shard_file(std::string_view n) {
  constexpr std::string_view head = "model-", mid = "-of-", tail = ".safetensors";
  if (n.size() <= head.size() + tail.size() || !n.starts_with(head) || !n.ends_with(tail)) {
    return false;
  }
  n = n.substr(head.size(), n.size() - head.size() - tail.size());
  const size_t at = n.find(mid);
  if (at == std::string_view::npos) return false;
  const std::string_view a = n.substr(0, at), b = n.substr(at + mid.size());
  return a.size() >= 5 && b.size() >= 5 && all_digits(a) && all_digits(b);
}

// files::Output's temporary of one of the export's files, ".NAME.tmp.PID.N", which only an
// export killed before its rename leaves behind.
bool is_leftover_temporary(std::string_view n) {
  constexpr std::string_view tmp = ".tmp.";
  if (!n.starts_with('.')) return false;
  const size_t at = n.find(tmp);
  if (at == std::string_view::npos || !is_hf_export_file(n.substr(1, at - 1))) return false;
  const std::string_view rest = n.substr(at + tmp.size());
  const size_t dot = rest.find('.');
  return dot != std::string_view::npos && all_digits(rest.substr(0, dot)) &&
         all_digits(rest.substr(dot + 1));
}

// --out as the user wrote it, without a trailing separator ("hf/" names "hf").
fs::path plain(const fs::path& p) { return p.has_filename() ? p : p.parent_path(); }

// The output's relation to the checkpoint: never the checkpoint (step or root), never inside
// its step directory, never a name the root's store owns (the root given, or the one a
// step_* directory lies in). A directory beside the steps
// under the root (ckpt/hf) is allowed, as export_fp32 allows ckpt/model.safetensors: the
// store never touches a name it does not own.
void check_not_the_checkpoint(const fs::path& dir, const fs::path& step, const fs::path& out) {
  const files::Named inputs[] = {{"checkpoint", step}};
  const files::Named outputs[] = {{"--out", out}};
  files::check_distinct(inputs, outputs);
  if (files::final_target(out) == files::final_target(dir)) {
    throw InvalidArgument(fmt::format(
        "--out '{}' is the checkpoint directory '{}' itself; write the export elsewhere",
        out.string(), dir.string()));
  }
  check_not_store_owned("--out", out, "checkpoint", dir);
  // Given a step directory of a checkpoint root, the root's names are as much the store's.
  if (const fs::path s = plain(step); owned_by_store(s.filename().string())) {
    check_not_store_owned("--out", out, "checkpoint", s.parent_path());
  }
}

struct OutDir {
  bool exists = false;
  std::vector<std::string> earlier;  // an earlier export's files and leftover temporaries
};

// What --out holds, refused (InvalidArgument, naming the entry) unless it is nothing, an
// empty directory or an earlier export's: a user's file is never overwritten or deleted.
OutDir inspect_out_dir(const fs::path& out) {
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(out, ec);
  if (!fs::exists(link)) {
    const fs::path parent = fs::absolute(out, ec).parent_path();
    if (!fs::is_directory(parent, ec)) {
      throw InvalidArgument(fmt::format(
          "--out '{}': its parent '{}' is not a directory; create it first (export creates "
          "only the output directory itself)",
          out.string(), parent.string()));
    }
    return {};
  }
  if (fs::is_symlink(link) && !fs::exists(fs::status(out, ec))) {
    throw InvalidArgument(
        fmt::format("--out '{}' is a link to '{}', which does not exist; name a directory",
                    out.string(), fs::read_symlink(out, ec).string()));
  }
  if (!fs::is_directory(fs::status(out, ec))) {
    throw InvalidArgument(fmt::format(
        "--out '{}' is {}; --format hf writes a directory: name a new or empty one, or an "
        "earlier Hugging Face export",
        out.string(), files::non_regular_kind(out).value_or("a regular file")));
  }
  OutDir r{true, {}};
  std::vector<std::string> names;
  for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) throw IoError(fmt::format("--out '{}': cannot list it: {}", out.string(), ec.message()));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const fs::path p = out / name;
    if (!is_hf_export_file(name) && !is_leftover_temporary(name)) {
      throw InvalidArgument(fmt::format(
          "--out '{}' holds '{}', which no Hugging Face export writes ({}); zerodp never "
          "deletes or overwrites a file it did not write: export into a new or empty "
          "directory, or move the file away",
          out.string(), name, kExportFiles));
    }
    if (fs::is_symlink(fs::symlink_status(p, ec))) {
      throw InvalidArgument(fmt::format(
          "--out '{}' holds '{}', a link to '{}'; writing through it would replace what it "
          "points at: remove the link or export elsewhere",
          out.string(), name, fs::read_symlink(p, ec).string()));
    }
    if (const auto kind = files::non_regular_kind(p)) {
      throw InvalidArgument(fmt::format(
          "--out '{}' holds '{}', which is {}, not a file an export wrote; move it away or "
          "export elsewhere",
          out.string(), name, *kind));
    }
    r.earlier.push_back(name);
  }
  return r;
}

// One tensor as the export writes it.
struct Planned {
  size_t unit = 0;
  TensorMeta src;    // zerodp's
  std::string name;  // Hugging Face's
  bool transposed = false;
  std::vector<int64_t> shape;  // Hugging Face's
  uint64_t bytes = 0;
};

std::vector<Planned> plan_tensors(const Meta& m, const HfLayout& layout, size_t element_bytes) {
  std::vector<Planned> out;
  std::map<std::string, std::string> taken;  // HF name -> zerodp name
  for (size_t ui = 0; ui < m.units.size(); ++ui) {
    for (const TensorMeta& t : m.units[ui].tensors) {
      HfName h = layout.tensor(m.model_kind, t.name);
      if (h.name.empty() || h.name.starts_with("__")) {
        throw InvalidArgument(
            fmt::format("export --format hf: the {} layout gives tensor {} the name \"{}\", which "
                        "safetensors cannot hold",
                        m.model_kind, t.name, h.name));
      }
      if (h.transposed && t.shape.size() != 2) {
        throw InvalidArgument(fmt::format(
            "export --format hf: the {} layout transposes tensor {}, which has {} dimensions; "
            "only a matrix can be",
            m.model_kind, t.name, t.shape.size()));
      }
      if (const auto [at, fresh] = taken.emplace(h.name, t.name); !fresh) {
        throw InvalidArgument(
            fmt::format("export --format hf: the {} layout names both {} and {} \"{}\"",
                        m.model_kind, at->second, t.name, h.name));
      }
      Planned& p = out.emplace_back();
      p.unit = ui;
      p.src = t;
      p.name = std::move(h.name);
      p.transposed = h.transposed;
      p.shape = h.transposed ? std::vector<int64_t>{t.shape[1], t.shape[0]} : t.shape;
      p.bytes = t.numel * element_bytes;
    }
  }
  return out;
}

// Streams tensors from the checkpoint into a writer, through buffers of about `chunk`
// elements, in the export's dtype.
class Streamer {
 public:
  Streamer(const Checkpoint& ckpt, HfDtype dtype, uint64_t chunk)
      : ckpt_(ckpt), dtype_(dtype), chunk_(chunk) {}

  // `where` names the file in a write error ("--out 'hf/model.safetensors'").
  void write(const Planned& t, safetensors::Writer& w, const std::string& where) {
    where_ = &where;
    if (t.transposed) {
      write_transposed(t, w);
    } else {
      for (uint64_t done = 0; done < t.src.numel; done += chunk_) {
        fit(buf_, std::min(chunk_, t.src.numel - done));
        ckpt_.read_weights(t.unit, t.src.offset + done, buf_);
        emit(w);
      }
    }
  }

  uint64_t buffer_bytes() const {
    return (buf_.capacity() + run_.capacity()) * sizeof(float) + b16_.capacity() * sizeof(BFloat16);
  }

 private:
  // zerodp holds the matrix as (R, K) = (out, in), row-major; Hugging Face's Conv1D wants
  // (K, R): its row k is zerodp's column k, R values K apart. Reading them one by one would
  // be one read per element, and reading the whole tensor first would tie memory to the
  // tensor. So HF's rows are made in blocks of b = chunk / R (at least 1): for the block
  // [k0, k0 + b), each zerodp row r gives one contiguous run [r][k0, k0 + b), which
  // read_weights reads in one go (from whichever rank files hold it), scattered into column
  // r of the block. That is numel / b reads of b values, and the block holds b * R values:
  // the chunk (one HF row when R alone passes the chunk).
  void write_transposed(const Planned& t, safetensors::Writer& w) {
    const auto rows = static_cast<uint64_t>(t.src.shape[0]);
    const auto cols = static_cast<uint64_t>(t.src.shape[1]);
    const uint64_t block = std::max<uint64_t>(1, chunk_ / std::max<uint64_t>(rows, 1));
    for (uint64_t k0 = 0; k0 < cols; k0 += block) {
      const uint64_t b = std::min(block, cols - k0);
      fit(buf_, b * rows);
      fit(run_, b);
      for (uint64_t r = 0; r < rows; ++r) {
        ckpt_.read_weights(t.unit, t.src.offset + r * cols + k0, run_);
        for (uint64_t j = 0; j < b; ++j) buf_[j * rows + r] = run_[j];
      }
      emit(w);
    }
  }

  // Sizes a buffer to n, growing it to exactly n: resize() alone may double the capacity,
  // and the bound is on what is held.
  template <typename T>
  static void fit(std::vector<T>& v, uint64_t n) {
    if (n > v.capacity()) v.reserve(n);
    v.resize(n);
  }

  // buf_ to the file: as it is, or rounded to bf16 (tensor/dtype.h: nearest, ties to even).
  void emit(safetensors::Writer& w) {
    try {
      if (dtype_ == HfDtype::kF32) {
        w.write_values(std::span<const float>(buf_));
        return;
      }
      fit(b16_, buf_.size());
      convert(std::span<const float>(buf_), std::span<BFloat16>(b16_));
      w.write_values(std::span<const BFloat16>(b16_));
    } catch (const IoError& e) {
      throw IoError(fmt::format("{}: {}", *where_, e.what()));
    }
  }

  const Checkpoint& ckpt_;
  HfDtype dtype_;
  uint64_t chunk_;
  const std::string* where_ = nullptr;
  std::vector<float> buf_;
  std::vector<float> run_;
  std::vector<BFloat16> b16_;
};

// One weight file, whole or not at all; returns its size.
uint64_t write_weight_file(const fs::path& out, const HfShard& shard,
                           std::span<const Planned> tensors,
                           const std::map<std::string, std::string>& metadata,
                           safetensors::ElementType type, Streamer& streamer) {
  const fs::path path = out / shard.file;
  const std::string where = fmt::format("--out '{}'", path.string());
  const auto to_out = [&](auto&& step_of_writing) {
    try {
      step_of_writing();
    } catch (const IoError& e) {
      throw IoError(fmt::format("{}: {}", where, e.what()));
    }
  };
  std::vector<safetensors::TensorDecl> decls;
  for (const Planned& t : tensors) decls.push_back({t.name, type, t.shape});
  // Declared before the writer, so the writer closes its file before an uncommitted output
  // removes it.
  files::Output output("--out", path);
  std::optional<safetensors::Writer> w;
  to_out([&] { w.emplace(output.write_path(), std::move(decls), metadata); });
  for (const Planned& t : tensors) streamer.write(t, *w, where);
  to_out([&] { (void)w->finish(); });
  const uint64_t bytes = w->file_bytes();
  w.reset();
  to_out([&] { output.commit(); });
  return bytes;
}

std::string index_json(std::span<const HfShard> shards, std::span<const Planned> tensors,
                       uint64_t total_size) {
  nlohmann::json map = nlohmann::json::object();
  for (const HfShard& s : shards) {
    for (size_t i = s.first; i < s.first + s.count; ++i) map[tensors[i].name] = s.file;
  }
  // Keys sorted, as save_pretrained's json.dumps(sort_keys=True) writes them.
  const nlohmann::json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", map}};
  return index.dump(2) + "\n";
}

// The earlier export's files this one did not write: its index first, so that no index
// ever names a shard that is gone. Returns how many were removed.
uint64_t remove_stale(const fs::path& out, const std::vector<std::string>& earlier,
                      const std::set<std::string>& written) {
  std::vector<std::string> stale;
  for (const std::string& name : earlier) {
    if (written.count(name) == 0) stale.push_back(name);
  }
  std::stable_partition(stale.begin(), stale.end(),
                        [](const std::string& n) { return n == kIndexFile; });
  for (const std::string& name : stale) {
    std::error_code ec;
    if (!fs::remove(out / name, ec) && ec) {
      throw IoError(fmt::format("--out '{}': cannot remove an earlier export's {}: {}",
                                out.string(), name, ec.message()));
    }
  }
  if (!stale.empty()) fsync_path(out);
  return stale.size();
}

}  // namespace

bool is_hf_export_file(std::string_view name) {
  return name == kConfigFile || name == kSingleFile || name == kIndexFile ||
         name == kTokenizerFile || is_shard_file(name);
}

std::vector<HfShard> plan_hf_shards(std::span<const uint64_t> tensor_bytes,
                                    uint64_t max_shard_bytes) {
  std::vector<HfShard> shards;
  HfShard cur;
  const auto close = [&](size_t next) {
    if (cur.count > 0) shards.push_back(cur);
    cur = HfShard{};
    cur.first = next;
  };
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    const uint64_t b = tensor_bytes[i];
    // A tensor never split: one past the limit closes the shard being filled and takes a
    // shard of its own; one that would tip the shard over closes it.
    if (b > max_shard_bytes || cur.bytes + b > max_shard_bytes) close(i);
    ++cur.count;
    cur.bytes += b;
    if (b > max_shard_bytes) close(i + 1);
  }
  close(tensor_bytes.size());
  if (shards.empty()) shards.emplace_back();
  for (size_t i = 0; i < shards.size(); ++i) {
    shards[i].file = shards.size() == 1
                         ? std::string(kSingleFile)
                         : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
  }
  return shards;
}

HfExportSummary export_hf(const fs::path& dir, const fs::path& out_arg, const HfLayout& layout,
                          const HfExportOptions& options, const ModelLayout& model_layout) {
  if (!layout.tensor || !layout.config) {
    throw InvalidArgument("export --format hf: no Hugging Face layout given");
  }
  if (options.chunk_elements == 0) {
    throw InvalidArgument("export: chunk_elements must be at least 1");
  }
  if (options.max_shard_bytes == 0) {
    throw InvalidArgument("--max-shard-size: a shard must hold at least 1 byte");
  }
  if (out_arg.empty()) throw InvalidArgument("--out: the path is empty");
  const fs::path out = plain(out_arg);
  const fs::path step = resolve(dir, "checkpoint");
  check_not_the_checkpoint(dir, step, out);
  const OutDir existing = inspect_out_dir(out);
  // meta.json against the model it names, config.json and the names: all before any shard
  // is hashed, so a wrong checkpoint or kind fails in milliseconds.
  const bool bf16 = options.dtype == HfDtype::kBF16;
  std::string config;
  {
    const Meta meta = read_meta(step);
    const std::string what = (step / "meta.json").string();
    if (model_layout) {
      if (const auto expected = model_layout(meta, what)) check_model(meta, *expected, what);
    }
    config = layout.config(meta.model_kind, meta.model_shape, bf16 ? "bfloat16" : "float32");
    (void)plan_tensors(meta, layout, 4);
  }
  const Checkpoint ckpt(step);
  const Meta& m = ckpt.meta();
  const safetensors::ElementType type =
      bf16 ? safetensors::ElementType::kBF16 : safetensors::ElementType::kF32;
  const std::vector<Planned> tensors = plan_tensors(m, layout, safetensors::element_size(type));
  std::vector<uint64_t> sizes;
  HfExportSummary summary;
  for (const Planned& t : tensors) {
    sizes.push_back(t.bytes);
    summary.total_size += t.bytes;
  }
  const std::vector<HfShard> shards = plan_hf_shards(sizes, options.max_shard_bytes);

  std::map<std::string, std::string> metadata;
  for (const auto& [k, v] : m.model_shape) metadata[k] = std::to_string(v);
  metadata["format"] = "pt";
  metadata["zerodp_format"] = kExportFormat;
  metadata["model"] = m.model_kind;
  metadata["step"] = std::to_string(m.step);

  std::error_code ec;
  if (!existing.exists) {
    if (!fs::create_directory(out, ec) && ec) {
      throw IoError(
          fmt::format("--out '{}': cannot create the directory: {}", out.string(), ec.message()));
    }
    fsync_path(fs::absolute(out).parent_path());
  }
  std::set<std::string> written;
  Streamer streamer(ckpt, options.dtype, options.chunk_elements);
  for (const HfShard& s : shards) {
    summary.bytes += write_weight_file(out, s, std::span(tensors).subspan(s.first, s.count),
                                       metadata, type, streamer);
    summary.weight_files.push_back(s.file);
    written.insert(s.file);
  }
  files::write_output("--out", out / kConfigFile, config);
  summary.bytes += config.size();
  written.insert(std::string(kConfigFile));
  if (!options.tokenizer_model.empty()) {
    files::write_output("--out", out / kTokenizerFile, options.tokenizer_model);
    summary.bytes += options.tokenizer_model.size();
    written.insert(std::string(kTokenizerFile));
  }
  if (shards.size() > 1) {
    const std::string index = index_json(shards, tensors, summary.total_size);
    files::write_output("--out", out / kIndexFile, index);
    summary.bytes += index.size();
    summary.indexed = true;
    written.insert(std::string(kIndexFile));
  }
  summary.removed = remove_stale(out, existing.earlier, written);
  summary.tensors = tensors.size();
  summary.buffer_bytes = streamer.buffer_bytes();
  return summary;
}

}  // namespace zerodp::checkpoint
