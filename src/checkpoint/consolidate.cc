#include "checkpoint/consolidate.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/safetensors.h"
#include "checkpoint/store.h"
#include "core/error.h"
#include "core/files.h"

namespace zerodp::checkpoint {
namespace {

// "gpt (embd 32, heads 2, layers 2, seq_len 32, vocab 256)": the model meta.json describes.
std::string model_text(const Meta& m) {
  std::vector<std::string> fields;
  for (const auto& [k, v] : m.model_shape) fields.push_back(fmt::format("{} {}", k, v));
  return fmt::format("{} ({})", m.model_kind, fmt::join(fields, ", "));
}

std::string tensor_text(const TensorMeta& t) {
  return fmt::format("{} [{}] at offset {}", t.name, fmt::join(t.shape, ", "), t.offset);
}

// meta.json's units checked against the model it names before any shard is hashed (the
// Checkpoint then checks each file): cheap next to the checksums, so a wrong checkpoint
// fails in milliseconds whatever its size.
void check_before_open(const std::filesystem::path& step, const ModelLayout& layout) {
  const std::string what = (step / "meta.json").string();
  const Meta meta = read_meta(step);
  if (layout) {
    if (const auto expected = layout(meta, what)) check_model(meta, *expected, what);
  }
}

}  // namespace

void check_model(const Meta& m, const std::vector<UnitMeta>& expected, const std::string& what) {
  if (m.units.size() != expected.size()) {
    throw CorruptData(fmt::format(
        "{}: field \"units\" lists {} units; the {} of field \"model\" has {} ({} .. {})", what,
        m.units.size(), model_text(m), expected.size(),
        expected.empty() ? "" : expected.front().name,
        expected.empty() ? "" : expected.back().name));
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const UnitMeta& saved = m.units[i];
    const UnitMeta& want = expected[i];
    if (saved.name != want.name || saved.numel != want.numel ||
        saved.tensors.size() != want.tensors.size()) {
      throw CorruptData(fmt::format(
          "{}: field \"units[{}]\" is \"{}\" with {} elements in {} tensors; the {} of field "
          "\"model\" has \"{}\" with {} in {}",
          what, i, saved.name, saved.numel, saved.tensors.size(), model_text(m), want.name,
          want.numel, want.tensors.size()));
    }
    for (size_t k = 0; k < want.tensors.size(); ++k) {
      if (!(saved.tensors[k] == want.tensors[k])) {
        throw CorruptData(fmt::format(
            "{}: field \"units[{}].tensors[{}]\" is {}; the {} of field \"model\" has {}", what, i,
            k, tensor_text(saved.tensors[k]), model_text(m), tensor_text(want.tensors[k])));
      }
    }
  }
}

ExportSummary export_fp32(const std::filesystem::path& dir, const std::filesystem::path& out,
                          uint64_t chunk_elements, const ModelLayout& layout) {
  if (chunk_elements == 0) throw InvalidArgument("export: chunk_elements must be at least 1");
  const std::filesystem::path step = resolve(dir, "checkpoint");
  // The step directory claims every file in it: an export over its own shard would destroy
  // the checkpoint it reads.
  const files::Named inputs[] = {{"checkpoint", step}};
  const files::Named outputs[] = {{"--out", out}};
  files::check_distinct(inputs, outputs);
  // Given the checkpoint root, --out must not take a name its checkpoints live by either
  // (an export over `latest` loses every later resume).
  check_not_store_owned("--out", out, "checkpoint", dir);
  check_before_open(step, layout);
  const Checkpoint ckpt(step);
  const Meta& m = ckpt.meta();
  std::vector<safetensors::TensorDecl> decls;
  ExportSummary summary;
  for (const UnitMeta& u : m.units) {
    for (const TensorMeta& t : u.tensors) {
      decls.push_back({t.name, safetensors::ElementType::kF32, t.shape});
      summary.largest_tensor_bytes = std::max(summary.largest_tensor_bytes, t.numel * 4);
    }
  }
  std::map<std::string, std::string> metadata{
      {"format", kExportFormat}, {"model", m.model_kind}, {"step", std::to_string(m.step)}};
  for (const auto& [k, v] : m.model_shape) metadata[k] = std::to_string(v);
  summary.tensors = decls.size();

  // Declared before the writer, so the writer closes its file before an uncommitted output
  // removes it.
  files::Output output("--out", out);
  // Write failures name the temporary beside the output; the user knows the flag.
  const auto to_out = [&](auto&& step_of_writing) {
    try {
      step_of_writing();
    } catch (const IoError& e) {
      throw IoError(fmt::format("--out '{}': {}", out.string(), e.what()));
    }
  };
  std::optional<safetensors::Writer> w;
  to_out([&] { w.emplace(output.write_path(), std::move(decls), metadata); });
  std::vector<float> buf;
  for (size_t ui = 0; ui < m.units.size(); ++ui) {
    for (const TensorMeta& t : m.units[ui].tensors) {
      for (uint64_t done = 0; done < t.numel; done += chunk_elements) {
        const uint64_t n = std::min(chunk_elements, t.numel - done);
        buf.resize(n);
        ckpt.read_weights(ui, t.offset + done, buf);
        to_out([&] { w->write_values(std::span<const float>(buf)); });
      }
    }
  }
  summary.buffer_bytes = buf.capacity() * sizeof(float);
  to_out([&] { summary.sha256 = w->finish(); });
  summary.bytes = w->file_bytes();
  w.reset();
  to_out([&] { output.commit(); });
  return summary;
}

ConsolidatedModel read_consolidated(const std::filesystem::path& dir, const ModelLayout& layout) {
  const std::filesystem::path step = resolve(dir, "checkpoint");
  check_before_open(step, layout);
  const Checkpoint ckpt(step);
  const Meta& m = ckpt.meta();
  ConsolidatedModel model;
  model.kind = m.model_kind;
  model.shape = m.model_shape;
  model.step = m.step;
  for (size_t ui = 0; ui < m.units.size(); ++ui) {
    model.unit_names.push_back(m.units[ui].name);
    std::vector<float> w(m.units[ui].numel);
    ckpt.read_weights(ui, 0, w);
    model.unit_weights.push_back(std::move(w));
  }
  return model;
}

}  // namespace zerodp::checkpoint
