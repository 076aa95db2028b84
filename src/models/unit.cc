// Unit's flat-buffer bookkeeping (tensors are appended back to back, so offsets are the
// running sum of the numels and the buffer has no gaps) and the buffer-length contract that
// forward/backward check before any unit's hook runs.
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

void Unit::check_exact(std::string_view fn, std::string_view what, size_t length, size_t expected,
                       const BatchShape& s) const {
  if (length != expected) {
    throw InvalidArgument(fmt::format("unit {} {}: {} holds {} elements; (B={}, T={}) needs {}",
                                      name_, fn, what, length, s.B, s.T, expected));
  }
}

void Unit::check_at_least(std::string_view fn, std::string_view what, size_t length,
                          size_t expected, const BatchShape& s) const {
  if (length < expected) {
    throw InvalidArgument(
        fmt::format("unit {} {}: {} holds {} elements; (B={}, T={}) needs at least {}", name_, fn,
                    what, length, s.B, s.T, expected));
  }
}

namespace {

// The stored copy is all of the unit's weights or absent: Bf16Operands reads an operand from
// it at the operand's offset within w.values.
void check_stored_bf16(const std::string& unit, std::string_view fn, const UnitWeights& w,
                       size_t numel) {
  if (!w.stored_bf16.empty() && w.stored_bf16.size() != numel) {
    throw InvalidArgument(fmt::format(
        "unit {} {}: w.stored_bf16 holds {} elements; the unit's {} weights need {} or none", unit,
        fn, w.stored_bf16.size(), numel, numel));
  }
}

}  // namespace

void Unit::forward(const UnitWeights& w, std::span<const float> in, std::span<float> out,
                   std::span<float> saved, std::span<float> scratch, const MicroBatch& mb) {
  const BatchShape& s = mb.shape;
  check_exact("forward", "w", w.values.size(), numel_, s);
  check_stored_bf16(name_, "forward", w, numel_);
  check_exact("forward", "in", in.size(), input_count(s), s);
  check_exact("forward", "out", out.size(), output_count(s), s);
  check_exact("forward", "saved", saved.size(), saved_count(s, w.compute), s);
  check_at_least("forward", "scratch", scratch.size(), scratch_count(s), s);
  // kBF16 products read the unit's weight operands from the stored copy (or round them once).
  const Bf16Operands w16(w.compute, w.values, w.stored_bf16);
  do_forward(w.values, w.compute, in, out, saved, scratch, mb);
}

void Unit::backward(const UnitWeights& w, std::span<const float> in, std::span<const float> saved,
                    std::span<const float> dout, std::span<float> dw, std::span<float> din,
                    std::span<float> scratch, const MicroBatch& mb) {
  const BatchShape& s = mb.shape;
  check_exact("backward", "w", w.values.size(), numel_, s);
  check_stored_bf16(name_, "backward", w, numel_);
  check_exact("backward", "in", in.size(), input_count(s), s);
  check_exact("backward", "saved", saved.size(), saved_count(s, w.compute), s);
  const size_t out_count = output_count(s);
  if (!(dout.empty() && out_count == 1)) check_exact("backward", "dout", dout.size(), out_count, s);
  check_exact("backward", "dw", dw.size(), numel_, s);
  check_exact("backward", "din", din.size(), input_count(s), s);
  check_at_least("backward", "scratch", scratch.size(), scratch_count(s), s);
  const Bf16Operands w16(w.compute, w.values, w.stored_bf16);
  do_backward(w.values, w.compute, in, saved, dout, dw, din, scratch, mb);
}

}  // namespace zerodp
