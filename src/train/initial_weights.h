// Starting from someone's weights (--init-from): a safetensors file holding the model's
// tensors under their canonical names (zerodp export's file, or a PyTorch state dict of the
// same model written with these names), F32, BF16 or F16 (16-bit values are widened; the
// fp32 master starts from them exactly). Each rank reads only the elements of its own
// ranges, so a file larger than one rank's memory is fine.
#pragma once

#include <filesystem>
#include <string>

#include "models/unit.h"
#include "train/rank_trainer.h"

namespace zerodp {

// InvalidArgument naming the file and the tensor unless the file holds exactly the model's
// tensors: each present, of the model's shape, F32, BF16 or F16, and nothing else. IoError
// or CorruptData when it cannot be read as safetensors.
void check_initial_weights(const Model& model, const std::string& model_name,
                           const std::filesystem::path& file);

// Replaces the trainer's parameters and master weights with the file's values over the
// ranges this rank holds (a fresh optimizer: the moments stay zero). The file was checked.
void load_initial_weights(RankTrainer& trainer, const std::filesystem::path& file);

}  // namespace zerodp
