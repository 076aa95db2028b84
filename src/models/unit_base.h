// Helpers shared by the model files (private to models/): a Unit base that hands out views
// of its tensors, a bump allocator over saved/scratch buffers, and attention over the qkv kept
// in either precision. (Buffer lengths are
// Unit::forward/backward's to check, models/unit.h.)
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "models/unit.h"
#include "nn/attention.h"

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

// An activation that only matrix products read. Under kBF16 it is kept in bf16 (the bf16
// pipeline: rounded once, by the layer that writes it, and read as stored by every product
// after), else in fp32; `in_bf16` says which span holds it.
template <typename F>  // float, or const float for backward's read-only view
struct ProductInput {
  using B = std::conditional_t<std::is_const_v<F>, const BFloat16, BFloat16>;
  std::span<F> f32;
  std::span<B> bf16;
  bool in_bf16 = false;

  GemmOperand operand() const {
    return in_bf16 ? GemmOperand(bf16) : GemmOperand(std::span<const float>(f32));
  }
  GemmResult result() const requires(!std::is_const_v<F>) {
    return in_bf16 ? GemmResult(bf16) : GemmResult(f32);
  }
  // Floats of saved buffer it takes.
  static size_t floats(size_t count, bool in_bf16) { return in_bf16 ? (count + 1) / 2 : count; }
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
  // `count` values of a product's input, in bf16 (two per float of the buffer) or fp32. The
  // bf16 values live in storage allocated as floats and are only ever accessed as BFloat16
  // while the unit holds them: forward writes them, backward reads them, nothing reads them
  // as floats.
  ProductInput<T> take_product_input(size_t count, bool in_bf16) {
    ProductInput<T> p;
    p.in_bf16 = in_bf16;
    if (!in_bf16) {
      p.f32 = take(count);
      return p;
    }
    const std::span<T> storage = take(ProductInput<T>::floats(count, true));
    p.bf16 = std::span<typename ProductInput<T>::B>(
        reinterpret_cast<typename ProductInput<T>::B*>(storage.data()), count);
    return p;
  }

 private:
  std::span<T> rest_;
};

// Attention reads qkv and writes its output in the precision both are kept in (the same).
inline void attention_into(const ProductInput<float>& out, std::span<float> saved,
                           std::span<float> scratch, const ProductInput<float>& qkv,
                           const AttentionDims& d, GemmCompute compute) {
  if (qkv.in_bf16) {
    attention_forward(out.bf16, saved, scratch, qkv.bf16, d, compute);
  } else {
    attention_forward(out.f32, saved, scratch, qkv.f32, d, compute);
  }
}

inline void attention_backward_from(std::span<float> dqkv, std::span<float> scratch,
                                    std::span<const float> dout,
                                    const ProductInput<const float>& qkv,
                                    std::span<const float> saved, const AttentionDims& d,
                                    GemmCompute compute) {
  if (qkv.in_bf16) {
    attention_backward(dqkv, scratch, dout, qkv.bf16, saved, d, compute);
  } else {
    attention_backward(dqkv, scratch, dout, qkv.f32, saved, d, compute);
  }
}

}  // namespace zerodp::models_detail
