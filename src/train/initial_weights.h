// Starting from someone's weights (--init-from): a safetensors file holding the model's
// tensors under their canonical names (zerodp export's file, or a PyTorch state dict of the
// same model written with these names), F32, BF16 or F16 (16-bit values are widened; the
// fp32 master starts from them exactly). Each rank reads only the elements of its own
// ranges, so a file larger than one rank's memory is fine.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "models/unit.h"
#include "train/rank_trainer.h"

namespace zerodp {

// The file's bytes as the check read them: their sha256 (the report's) and a CRC-32C of
// each block. Every later read of the file, the check's own and each rank's, is served in
// whole blocks compared with these, so the bytes that are checked, hashed and trained on
// are the same: a file rewritten meanwhile is refused, never trained on.
struct InitDigest {
  static constexpr uint64_t kBlock = uint64_t{64} << 10;
  uint64_t size = 0;
  std::string sha256;
  std::vector<uint32_t> block_crc;
};

// InvalidArgument naming the file and the tensor unless the file holds exactly the model's
// tensors: each present, of the model's shape, F32, BF16 or F16, finite, and nothing else.
// IoError or CorruptData when it cannot be read as safetensors, or changes while read.
InitDigest check_initial_weights(const Model& model, const std::string& model_name,
                                 const std::filesystem::path& file);

// Replaces the trainer's parameters and master weights with the file's values over the
// ranges this rank holds (a fresh optimizer: the moments stay zero). The file was checked:
// CorruptData when a byte read differs from what `digest` saw.
void load_initial_weights(RankTrainer& trainer, const std::filesystem::path& file,
                          const InitDigest& digest);

}  // namespace zerodp
