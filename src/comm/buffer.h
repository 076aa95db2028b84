// ConstBuffer and MutableBuffer: a type-erased view of `count` elements of `dtype`, what the
// collectives and the quantizer take. A view: the caller owns the memory and keeps it alive.
#pragma once

#include <cstddef>
#include <span>

#include "tensor/dtype.h"

namespace zerodp {

// A buffer handed to a collective: `count` elements of `dtype` at `data`.
struct ConstBuffer {
  const void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  template <typename T>
  ConstBuffer(std::span<const T> s) : data(s.data()), count(s.size()), dtype(dtype_of<T>()) {}
  template <typename T>
  ConstBuffer(std::span<T> s) : data(s.data()), count(s.size()), dtype(dtype_of<T>()) {}
  ConstBuffer(const void* d, size_t n, DType t) : data(d), count(n), dtype(t) {}
  size_t bytes() const { return count * dtype_size(dtype); }
};
struct MutableBuffer {
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  template <typename T>
  MutableBuffer(std::span<T> s) : data(s.data()), count(s.size()), dtype(dtype_of<T>()) {}
  MutableBuffer(void* d, size_t n, DType t) : data(d), count(n), dtype(t) {}
  size_t bytes() const { return count * dtype_size(dtype); }
  operator ConstBuffer() const { return {data, count, dtype}; }
};

}  // namespace zerodp
