// A sharded checkpoint as one model: `zerodp export` and `zerodp sample` read it this way.
//
// Both check what they read before they use a byte of it, as `train --resume` does: the
// files are regular files (a FIFO or a link to /dev/zero is corrupt data, never a hang),
// meta.json's units agree with themselves (format.h) and with the model its "model" field
// describes (ModelLayout), and every shard's size, checksum and tensors agree with meta.json
// (Checkpoint). Any disagreement is CorruptData naming the file and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/format.h"

namespace zerodp::checkpoint {

// The safetensors __metadata__ "format" of an exported file.
inline constexpr const char* kExportFormat = "zerodp-export-1";

// The units a model of meta's kind and shape ("model" in meta.json) has, as meta.json would
// describe them (counts left empty), or nullopt for a kind the caller cannot build. The
// models live above this library, so the caller supplies them (cli: gpt and mlp). It may
// throw CorruptData naming `what` (meta.json) and the field, and must not build a model
// whose size the meta has not yet bounded: a layer count of 10^12 is refused, not built.
using ModelLayout =
    std::function<std::optional<std::vector<UnitMeta>>(const Meta& meta, const std::string& what)>;

// meta.json's units as a model's units would be described: name, numel and tensors.
// `units` is a range of unit pointers (models/unit.h: Model).
template <typename Units>
std::vector<UnitMeta> describe_units(const Units& units) {
  std::vector<UnitMeta> out;
  for (const auto& unit : units) {
    UnitMeta& u = out.emplace_back();
    u.name = unit->name();
    u.numel = unit->numel();
    for (const auto& t : unit->tensors()) u.tensors.push_back({t.name, t.shape, t.offset, t.numel});
  }
  return out;
}

// Throws CorruptData naming `what` and the first field where `meta`'s units differ from
// `expected` (the layout of meta's "model").
void check_model(const Meta& meta, const std::vector<UnitMeta>& expected, const std::string& what);

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
// large the model.
//
// Everything is verified before the output is opened (CorruptData, see above; an empty
// `layout` checks meta.json against itself only); `out` may
// not be inside the checkpoint (InvalidArgument). The output goes through files::Output:
// a regular file appears whole or not at all (nothing is left behind on failure), a link is
// followed, a device is written in place. Write failures are IoError naming --out.
ExportSummary export_fp32(const std::filesystem::path& dir, const std::filesystem::path& out,
                          uint64_t chunk_elements = uint64_t{1} << 20,
                          const ModelLayout& layout = {});

// The consolidated fp32 weights in memory, one flat buffer per unit (the unit's layout),
// verified as export_fp32 verifies them.
struct ConsolidatedModel {
  std::string kind;                      // "gpt", "mlp", ...
  std::map<std::string, int64_t> shape;  // the model's shape fields
  std::vector<std::string> unit_names;
  std::vector<std::vector<float>> unit_weights;
  uint64_t step = 0;
};
ConsolidatedModel read_consolidated(const std::filesystem::path& dir,
                                    const ModelLayout& layout = {});

}  // namespace zerodp::checkpoint
