#include "checkpoint/consolidate.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "checkpoint/safetensors.h"
#include "checkpoint/store.h"
#include "core/error.h"

namespace zerodp::checkpoint {

ExportSummary export_fp32(const std::filesystem::path& dir, const std::filesystem::path& out,
                          uint64_t chunk_elements) {
  if (chunk_elements == 0) throw InvalidArgument("export: chunk_elements must be at least 1");
  const Checkpoint ckpt(resolve(dir, "checkpoint"));
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

  const std::filesystem::path partial = out.string() + ".partial";
  std::string sha;
  {
    safetensors::Writer w(partial, std::move(decls), metadata);
    std::vector<float> buf;
    for (size_t ui = 0; ui < m.units.size(); ++ui) {
      for (const TensorMeta& t : m.units[ui].tensors) {
        for (uint64_t done = 0; done < t.numel; done += chunk_elements) {
          const uint64_t n = std::min(chunk_elements, t.numel - done);
          buf.resize(n);
          ckpt.read_master(ui, t.offset + done, buf);
          w.write_values(std::span<const float>(buf));
        }
      }
    }
    summary.buffer_bytes = buf.capacity() * sizeof(float);
    sha = w.finish();
  }
  if (std::rename(partial.c_str(), out.c_str()) != 0) {
    throw IoError(fmt::format("export: cannot rename {} to {}", partial.string(), out.string()));
  }
  const std::filesystem::path parent = out.parent_path().empty() ? "." : out.parent_path();
  fsync_path(parent);
  summary.bytes = std::filesystem::file_size(out);
  summary.sha256 = sha;
  return summary;
}

ConsolidatedModel read_consolidated(const std::filesystem::path& dir) {
  const Checkpoint ckpt(resolve(dir, "checkpoint"));
  const Meta& m = ckpt.meta();
  ConsolidatedModel model;
  model.kind = m.model_kind;
  model.shape = m.model_shape;
  model.step = m.step;
  for (size_t ui = 0; ui < m.units.size(); ++ui) {
    model.unit_names.push_back(m.units[ui].name);
    std::vector<float> w(m.units[ui].numel);
    ckpt.read_master(ui, 0, w);
    model.unit_weights.push_back(std::move(w));
  }
  return model;
}

}  // namespace zerodp::checkpoint
