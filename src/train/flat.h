// Element-wise helpers over a flat buffer whose dtype is known at run time (f32, bf16, f16):
// the engine keeps parameters and gradients in the run's precision and computes in fp32.
#pragma once

#include <cstddef>
#include <span>

#include "tensor/dtype.h"

namespace zerodp {

// out[i] = fp32 value of element (first + i) of a buffer of `dtype` at `data`.
void widen(const void* data, DType dtype, size_t first, std::span<float> out);
// Element (first + i) = in[i] rounded to `dtype` (to nearest even).
void narrow(std::span<const float> in, void* data, DType dtype, size_t first);
// Element (first + i) = round(widen(element) + in[i]): one rounding per accumulation, the
// fixed order and dtype in which micro-batch gradients are summed.
void accumulate(std::span<const float> in, void* data, DType dtype, size_t first);
// Whether every element of [first, first + count) is finite.
bool all_finite(const void* data, DType dtype, size_t first, size_t count);

}  // namespace zerodp
