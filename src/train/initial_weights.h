// Starting from someone's weights (--init-from), in either of two layouts:
//
// * zerodp's: one safetensors file holding the model's tensors under their canonical names
//   (zerodp export's file, or a PyTorch state dict of the same model written with these
//   names). A file whose __metadata__ has no "format", or "zerodp-export-1", is read so.
// * Hugging Face's (train/hf_layout.h): a directory with config.json and model.safetensors,
//   or model.safetensors.index.json and its shards; or one file whose "format" is "pt" (what
//   Hugging Face writes). GPT-2's Conv1D weights are transposed on the way, a tied head is
//   copied from the embedding, and the buffers real files carry (attention masks, rotary
//   frequencies) are skipped by name.
//
// F32, BF16 or F16 (16-bit values are widened; the fp32 master starts from them exactly).
// Each rank reads only the elements of its own ranges, so files larger than one rank's
// memory are fine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/unit.h"
#include "train/config.h"
#include "train/held_islands.h"
#include "train/hf_layout.h"

namespace zerodp {

// The files' bytes as the check read them: each file's sha256 and a CRC-32C of each block.
// Every later read, the check's own and each rank's, is served in whole blocks compared with
// these, so the bytes that are checked, hashed and trained on are the same: a file rewritten
// meanwhile is refused, never trained on. Where each of the model's tensors is found is
// decided once, here, from the headers (and the index) these bytes hold.
struct InitDigest {
  static constexpr uint64_t kBlock = uint64_t{64} << 10;
  struct File {
    std::filesystem::path path;
    uint64_t size = 0;
    std::string sha256;
    std::vector<uint32_t> block_crc;
  };
  struct Source {
    size_t file = 0;
    std::string name;         // the tensor's name in that file
    bool transposed = false;  // the file holds (in, out) where the model holds (out, in)
  };
  std::vector<File> files;                // the safetensors files, in the order first named
  std::map<std::string, Source> tensors;  // by the model's tensor name
  bool hugging_face = false;              // the layout the names follow
  // The report's: one file's own sha256; for a directory, the sha256 of sha256sum's lines
  // ("<hex>  <name>\n") for config.json, the index if any, then each shard in order.
  std::string sha256;
};

// A Hugging Face directory (one with config.json) gives the run its model: the kind and
// every shape field the user left out (cfg.given); a flag that differs is refused naming
// both values and config.json (a llama's --seq-len is free: no weight depends on it).
// Nothing happens for a file, or for a configuration built in code.
void adopt_init_model(TrainConfig& cfg);

// InvalidArgument naming the file and the tensor unless the files hold exactly the model's
// tensors: each present, of the model's shape (transposed where the layout says), F32, BF16
// or F16, finite, and nothing else but the skipped buffers. IoError or CorruptData when one
// cannot be read as safetensors, or changes while read.
InitDigest check_initial_weights(const Model& model, const std::string& model_name,
                                 std::string_view model_kind, const std::filesystem::path& from);

// The model of a Hugging Face directory: its config.json read and checked (InvalidArgument
// naming the file and the key; a directory without one is refused saying what would do).
hf::HfConfig hf_model_of(const std::filesystem::path& dir);

// Every unit's weights whole, one flat buffer per unit, from files check_initial_weights
// checked against `model` (zerodp sample).
std::vector<std::vector<float>> read_initial_weights(const Model& model, const InitDigest& digest);

// Replaces the parameters and master weights of every island `islands` holds (each starts
// from them) with the files' values over the ranges this rank holds (a fresh optimizer: the
// moments stay zero). The files were checked: CorruptData when a byte read differs from what
// `digest` saw.
void load_initial_weights(HeldIslands& islands, const InitDigest& digest);

}  // namespace zerodp
