// A sharded checkpoint as a Hugging Face model directory: `zerodp export --format hf`.
//
//   DIR/config.json                          the caller's text (the model's HF config)
//   DIR/model.safetensors                    when every tensor fits in one shard, else
//   DIR/model-00001-of-0000N.safetensors ... and
//   DIR/model.safetensors.index.json         {"metadata": {"total_size": B},
//                                             "weight_map": {hf_name: file, ...}}
//
// save_pretrained's layout: 5-digit shard numbers, tensors given to shards greedily in model
// order and never split, a tensor larger than the limit alone in a shard of its own (HF's
// hub puts such a tensor before the shard being filled; here the shard being filled is
// closed first, so the files hold the tensors in model order). B is the sum of the tensors'
// bytes, headers not counted, as HF counts it; the limit too counts tensor bytes only.
//
// The checkpoint library knows no model: names, orientation and config.json come from the
// caller (cli/export.cc asks src/train/hf_layout.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/consolidate.h"

namespace zerodp::checkpoint {

// Where a zerodp tensor goes in Hugging Face's files.
struct HfName {
  std::string name;
  bool transposed = false;  // zerodp holds (out, in), HF (in, out): GPT-2's Conv1D
};

struct HfLayout {
  // The name and orientation of zerodp tensor `name` of a model of `kind`.
  std::function<HfName(const std::string& kind, const std::string& name)> tensor;
  // config.json's text for a model of `kind` with meta.json's shape fields, its weights
  // stored as `torch_dtype` ("float32" or "bfloat16"). Called once meta.json is read and
  // before any shard is hashed or anything written: the place to refuse a kind with no
  // layout.
  std::function<std::string(const std::string& kind, const std::map<std::string, int64_t>& shape,
                            std::string_view torch_dtype)>
      config;
};

enum class HfDtype { kF32, kBF16 };

struct HfExportOptions {
  HfDtype dtype = HfDtype::kF32;  // kBF16: each fp32 master value rounded to nearest even
  uint64_t max_shard_bytes = 5'000'000'000;  // save_pretrained's "5GB"
  uint64_t chunk_elements = uint64_t{1} << 20;
  // The bytes of a SentencePiece model to write as tokenizer.model (the file name
  // LlamaTokenizer loads); empty: none written, and an earlier export's is removed.
  std::string tokenizer_model;
};

struct HfExportSummary {
  uint64_t tensors = 0;
  uint64_t total_size = 0;                // the tensors' bytes (the index's total_size)
  uint64_t bytes = 0;                     // every file written, config.json and index included
  std::vector<std::string> weight_files;  // in order
  bool indexed = false;                   // model.safetensors.index.json written
  uint64_t removed = 0;                   // a previous export's files no longer part of this one
  uint64_t buffer_bytes = 0;              // the most this export held in memory for tensor data
};

// Writes the checkpoint in `dir` (a step directory or a checkpoint root with `latest`) as a
// Hugging Face model directory `out`, streaming: memory stays near `chunk_elements` however
// large the model or a tensor (a transposed tensor needs at least one of HF's rows, its
// zerodp row count, which no real Conv1D brings near a chunk).
//
// The directory, decided for safety (nothing of the user's is ever overwritten or deleted):
// * created if missing (its parent must exist); a path that exists and is not a directory
//   is refused;
// * if it exists it may be empty or hold only an earlier HF export's files (config.json,
//   model.safetensors, model-NNNNN-of-NNNNN.safetensors, model.safetensors.index.json, and
//   files::Output's temporaries of those names a killed export left). Anything else is
//   refused naming it, as is one of those names that is a link, a directory or not a
//   regular file (a link would make zerodp replace what it points at);
// * it may not be the checkpoint, lie inside its step directory, or take a name the
//   checkpoint root's store owns (latest, step_*, .tmp.*: of the root given, or of the one a
//   step_* directory given lies in). Another name under the root (ckpt/hf) is allowed, as
//   export_fp32 allows ckpt/model.safetensors: the store touches only its own names.
// All of that, meta.json against `model_layout`, the layout's names (unique, a transposed
// tensor 2-D) and every shard's checksum are checked before anything is created.
//
// Writing: each file through files::Output (a temporary renamed over the old one), the
// weights first, then config.json and tokenizer.model, the index last; only then are the earlier
// export's files this one did not write removed (its index first, so no index names a missing
// shard), and the directory fsynced. A reader that loads while an export runs may see a mix of the
// two (HF's own save_pretrained is no different), and so may one after an export failed part way
// (each file is whole; rerun it); once it returns, the directory is one export.
//
// Each weight file's __metadata__: "format": "pt" (transformers refuses other values),
// "zerodp_format": kExportFormat, "model", the shape fields and "step" (decimal strings).
// InvalidArgument for a refused output or layout, CorruptData for a damaged checkpoint,
// IoError naming --out and the file for a failed write.
HfExportSummary export_hf(const std::filesystem::path& dir, const std::filesystem::path& out,
                          const HfLayout& layout, const HfExportOptions& options = {},
                          const ModelLayout& model_layout = {});

// Whether `name` is one of the files an HF export writes into its directory.
bool is_hf_export_file(std::string_view name);

// One weight file of the export: its name and the tensors (indices in model order) it holds.
struct HfShard {
  std::string file;
  size_t first = 0;  // tensors [first, first + count)
  size_t count = 0;
  uint64_t bytes = 0;  // its tensors' bytes
};
// The weight files for tensors of `tensor_bytes` (model order) under `max_shard_bytes`:
// "model.safetensors" when one file holds them all, else "model-0000i-of-0000N.safetensors".
std::vector<HfShard> plan_hf_shards(std::span<const uint64_t> tensor_bytes,
                                    uint64_t max_shard_bytes);

}  // namespace zerodp::checkpoint
