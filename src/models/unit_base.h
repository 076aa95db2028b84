// Helpers shared by the model files (private to models/): a Unit base that hands out views
// of its tensors, a bump allocator over saved/scratch buffers, and span-length checks.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
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

  // Throws InvalidArgument unless `buffer` holds exactly `expected` elements.
  template <typename T>
  void check_exact(std::string_view fn, std::string_view what, std::span<T> buffer, size_t expected,
                   const BatchShape& s) const {
    if (buffer.size() != expected) {
      throw InvalidArgument(fmt::format("unit {} {}: {} holds {} elements; (B={}, T={}) needs {}",
                                        name(), fn, what, buffer.size(), s.B, s.T, expected));
    }
  }
  // As check_exact, but a longer buffer is accepted (the engine may share one workspace).
  template <typename T>
  void check_at_least(std::string_view fn, std::string_view what, std::span<T> buffer,
                      size_t expected, const BatchShape& s) const {
    if (buffer.size() < expected) {
      throw InvalidArgument(
          fmt::format("unit {} {}: {} holds {} elements; (B={}, T={}) needs at least {}", name(),
                      fn, what, buffer.size(), s.B, s.T, expected));
    }
  }
};

// Cuts consecutive pieces off the front of a buffer: the layout of saved and scratch is the
// order of take() calls, so forward and backward must take in the same order.
template <typename T>
class Carver {
 public:
  explicit Carver(std::span<T> buffer) : rest_(buffer) {}
  std::span<T> take(size_t count) {
    std::span<T> piece = rest_.first(count);  // callers checked the total length
    rest_ = rest_.subspan(count);
    return piece;
  }

 private:
  std::span<T> rest_;
};

}  // namespace zerodp::models_detail
