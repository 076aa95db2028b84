// A sharded checkpoint as one model: `zerodp export` and `zerodp sample` read it this way.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace zerodp::checkpoint {

// The safetensors __metadata__ "format" of an exported file.
inline constexpr const char* kExportFormat = "zerodp-export-1";

struct ExportSummary {
  uint64_t tensors = 0;
  uint64_t bytes = 0;  // the file's size
  uint64_t largest_tensor_bytes = 0;
  uint64_t buffer_bytes = 0;  // the most this export held in memory for tensor data
  std::string sha256;         // of the file
};

// Writes the consolidated fp32 weights of the checkpoint in `dir` (a step directory or a
// checkpoint root with `latest`) to `out` as one safetensors file: one F32 tensor per
// parameter under its canonical name, in model order, and __metadata__ with "format",
// "model" and the model's shape fields ("layers", "heads", ... as decimal strings) and
// "step". Streams in pieces of at most `chunk_elements`, so memory stays near that however
// large the model; the file appears under `out` only when complete (written beside it,
// fsynced, renamed). Verifies the checkpoint first (CorruptData on any mismatch).
ExportSummary export_fp32(const std::filesystem::path& dir, const std::filesystem::path& out,
                          uint64_t chunk_elements = uint64_t{1} << 20);

// The consolidated fp32 weights in memory, one flat buffer per unit (the unit's layout).
struct ConsolidatedModel {
  std::string kind;                      // "gpt", "mlp", ...
  std::map<std::string, int64_t> shape;  // the model's shape fields
  std::vector<std::string> unit_names;
  std::vector<std::vector<float>> unit_weights;
  uint64_t step = 0;
};
ConsolidatedModel read_consolidated(const std::filesystem::path& dir);

}  // namespace zerodp::checkpoint
