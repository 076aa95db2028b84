// Helpers shared by the model files (private to models/): a Unit base that hands out views
// of its tensors, and a bump allocator over saved/scratch buffers. (Buffer lengths are
// Unit::forward/backward's to check, models/unit.h.)
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "models/unit.h"

namespace zerodp::models_detail {

// Where one tensor lives in its unit's flat buffer.
struct Slot {
  size_t offset = 0;
  size_t numel = 0;
  std::span<const float> of(std::span<const float> flat) const {
    return flat.subspan(offset, numel);
  }
  std::span<float> of(std::span<float> flat) const { return flat.subspan(offset, numel); }
};

class ParamUnit : public Unit {
 protected:
  using Unit::Unit;
  // add_tensor, returning where the tensor landed.
  Slot param(std::string name, std::vector<int64_t> shape, InitKind init, float init_std,
             bool weight_decay, TensorUse use = TensorUse::kAny) {
    add_tensor(std::move(name), std::move(shape), init, init_std, weight_decay, use);
    return Slot{tensors().back().offset, tensors().back().numel};
  }
};

// Cuts consecutive pieces off the front of a buffer: the layout of saved and scratch is the
// order of take() calls, so forward and backward must take in the same order.
template <typename T>
class Carver {
 public:
  explicit Carver(std::span<T> buffer) : rest_(buffer) {}
  std::span<T> take(size_t count) {
    std::span<T> piece = rest_.first(count);  // Unit::forward/backward checked the total
    rest_ = rest_.subspan(count);
    return piece;
  }

 private:
  std::span<T> rest_;
};

}  // namespace zerodp::models_detail
