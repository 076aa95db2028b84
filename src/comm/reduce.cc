#include "comm/reduce.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

#include "core/error.h"

namespace zerodp {
namespace {

// Elements per block: the fp32 accumulator (8 KiB) and one widened input stay in L1.
constexpr size_t kBlock = 2048;

inline void accumulate(float* acc, const float* x, size_t n, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    for (size_t j = 0; j < n; ++j) {
      const float a = acc[j];
      // NaN propagates: a NaN accumulator stays, a NaN input replaces.
      acc[j] = (a >= x[j] || a != a) ? a : x[j];
    }
  } else {
    for (size_t j = 0; j < n; ++j) acc[j] += x[j];
  }
}

inline void finish(float* acc, size_t n, ReduceOp op, int divisor_count) {
  if (op != ReduceOp::kAvg) return;
  const float divisor = static_cast<float>(divisor_count);
  for (size_t j = 0; j < n; ++j) acc[j] /= divisor;
}

template <typename T>
void reduce_typed(std::span<const void* const> inputs, T* out, size_t count, ReduceOp op,
                  int divisor) {
  const int world = static_cast<int>(inputs.size());
  alignas(64) std::array<float, kBlock> acc;
  alignas(64) std::array<float, kBlock> wide;
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = std::min(kBlock, count - begin);
    for (int k = 0; k < world; ++k) {
      const T* x = static_cast<const T*>(inputs[k]) + begin;
      if constexpr (std::is_same_v<T, float>) {
        if (k == 0) {
          std::memcpy(acc.data(), x, n * sizeof(float));
        } else {
          accumulate(acc.data(), x, n, op);
        }
      } else {
        convert(std::span<const T>(x, n), std::span<float>(k == 0 ? acc.data() : wide.data(), n));
        if (k > 0) accumulate(acc.data(), wide.data(), n, op);
      }
    }
    finish(acc.data(), n, op, divisor);
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(out + begin, acc.data(), n * sizeof(float));
    } else {
      convert(std::span<const float>(acc.data(), n), std::span<T>(out + begin, n));
    }
  }
}

// kSumInto: the accumulator is the fold's start; inputs are widened exactly.
template <typename T>
void sum_into_typed(std::span<const void* const> inputs, float* out, size_t count) {
  alignas(64) std::array<float, kBlock> wide;
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = std::min(kBlock, count - begin);
    float* acc = out + begin;
    for (const void* input : inputs) {
      const T* x = static_cast<const T*>(input) + begin;
      if constexpr (std::is_same_v<T, float>) {
        accumulate(acc, x, n, ReduceOp::kSum);
      } else {
        convert(std::span<const T>(x, n), std::span<float>(wide.data(), n));
        accumulate(acc, wide.data(), n, ReduceOp::kSum);
      }
    }
  }
}

}  // namespace

void add_widened(ConstBuffer x, std::span<float> acc) {
  alignas(64) std::array<float, kBlock> wide;
  for (size_t begin = 0; begin < acc.size(); begin += kBlock) {
    const size_t n = std::min(kBlock, acc.size() - begin);
    const float* w = wide.data();
    switch (x.dtype) {
      case DType::kF32:
        w = static_cast<const float*>(x.data) + begin;
        break;
      case DType::kF16:
        convert(std::span<const Float16>(static_cast<const Float16*>(x.data) + begin, n),
                std::span<float>(wide.data(), n));
        break;
      case DType::kBF16:
        convert(std::span<const BFloat16>(static_cast<const BFloat16*>(x.data) + begin, n),
                std::span<float>(wide.data(), n));
        break;
      case DType::kU8:
        throw InvalidArgument("reduce: u8 holds raw bytes, which are moved, never reduced");
    }
    accumulate(acc.data() + begin, w, n, ReduceOp::kSum);
  }
}

void finish_sum(std::span<float> sum, MutableBuffer out, ReduceOp op, int world) {
  if (op == ReduceOp::kSumInto) {
    if (!sum.empty()) std::memcpy(out.data, sum.data(), sum.size_bytes());
    return;
  }
  finish(sum.data(), sum.size(), op, world);
  switch (out.dtype) {
    case DType::kF32:
      if (!sum.empty()) std::memcpy(out.data, sum.data(), sum.size_bytes());
      break;
    case DType::kF16:
      convert(std::span<const float>(sum),
              std::span<Float16>(static_cast<Float16*>(out.data), sum.size()));
      break;
    case DType::kBF16:
      convert(std::span<const float>(sum),
              std::span<BFloat16>(static_cast<BFloat16*>(out.data), sum.size()));
      break;
    case DType::kU8:
      throw InvalidArgument("reduce: u8 holds raw bytes, which are moved, never reduced");
  }
}

void reduce_rank_order(std::span<const void* const> inputs, void* out, size_t count, DType dtype,
                       ReduceOp op, int divisor) {
  if (inputs.empty() || count == 0) return;
  if (divisor <= 0) divisor = static_cast<int>(inputs.size());
  if (op == ReduceOp::kSumInto) {
    auto* acc = static_cast<float*>(out);
    switch (dtype) {
      case DType::kF32:
        sum_into_typed<float>(inputs, acc, count);
        break;
      case DType::kF16:
        sum_into_typed<Float16>(inputs, acc, count);
        break;
      case DType::kBF16:
        sum_into_typed<BFloat16>(inputs, acc, count);
        break;
      case DType::kU8:
        throw InvalidArgument("reduce: u8 holds raw bytes, which are moved, never reduced");
    }
    return;
  }
  if (dtype == DType::kU8) {
    throw InvalidArgument("reduce: u8 holds raw bytes, which are moved, never reduced");
  }
  // One input and nothing to divide by: the fold is the input, bit for bit (widening is exact,
  // and so is rounding back what was widened), so it is copied, not computed. A rank alone
  // spent a second a step here on a 2-billion-parameter model.
  if (inputs.size() == 1 && (op != ReduceOp::kAvg || divisor == 1)) {
    if (inputs[0] != out) std::memmove(out, inputs[0], count * dtype_size(dtype));
    return;
  }
  switch (dtype) {
    case DType::kF32:
      reduce_typed(inputs, static_cast<float*>(out), count, op, divisor);
      break;
    case DType::kF16:
      reduce_typed(inputs, static_cast<Float16*>(out), count, op, divisor);
      break;
    case DType::kBF16:
      reduce_typed(inputs, static_cast<BFloat16*>(out), count, op, divisor);
      break;
    case DType::kU8:
      throw InvalidArgument("reduce: u8 holds raw bytes, which are moved, never reduced");
  }
}

}  // namespace zerodp
