// Unit's flat-buffer bookkeeping: tensors are appended back to back, so offsets are the
// running sum of the numels and the buffer has no gaps.
#include "models/unit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace zerodp {

void Unit::add_tensor(std::string name, std::vector<int64_t> shape, InitKind init, float init_std,
                      bool weight_decay, TensorUse use) {
  if (shape.empty()) {
    throw InvalidArgument(
        fmt::format("unit {}: tensor {} has no dimensions; give it a shape", name_, name));
  }
  size_t numel = 1;
  for (const int64_t d : shape) {
    if (d <= 0) {
      throw InvalidArgument(
          fmt::format("unit {}: tensor {} has shape ({}); every dimension must be at least 1",
                      name_, name, fmt::join(shape, ", ")));
    }
    numel *= static_cast<size_t>(d);
  }
  if (init == InitKind::kNormal && !(init_std >= 0.0f)) {
    throw InvalidArgument(
        fmt::format("unit {}: tensor {} has init_std {}; it must be >= 0", name_, name, init_std));
  }
  for (const TensorSpec& t : tensors_) {
    if (t.name == name) {
      throw InvalidArgument(fmt::format("unit {}: tensor {} added twice", name_, name));
    }
  }
  tensors_.push_back(TensorSpec{.name = std::move(name),
                                .shape = std::move(shape),
                                .offset = numel_,
                                .numel = numel,
                                .init = init,
                                .init_std = init_std,
                                .weight_decay = weight_decay,
                                .use = use});
  numel_ += numel;
}

}  // namespace zerodp
