#include "train/flat.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "optim/grad_clip.h"
#include "optim/loss_scaler.h"

namespace zerodp {
namespace {

constexpr size_t kChunk = 4096;

template <typename T>
const T* as(const void* p) {
  return static_cast<const T*>(p);
}
template <typename T>
T* as(void* p) {
  return static_cast<T*>(p);
}

// Calls fn(chunk of fp32 values) over [first, first + count) of the buffer.
template <typename Fn>
void for_each_chunk(const void* data, DType dtype, size_t first, size_t count, Fn&& fn) {
  std::array<float, kChunk> tmp;
  for (size_t done = 0; done < count; done += kChunk) {
    const size_t n = std::min(kChunk, count - done);
    widen(data, dtype, first + done, std::span<float>(tmp.data(), n));
    fn(std::span<const float>(tmp.data(), n));
  }
}

}  // namespace

void widen(const void* data, DType dtype, size_t first, std::span<float> out) {
  switch (dtype) {
    case DType::kF32:
      if (!out.empty()) std::memcpy(out.data(), as<float>(data) + first, out.size_bytes());
      break;
    case DType::kBF16:
      convert(std::span<const BFloat16>(as<BFloat16>(data) + first, out.size()), out);
      break;
    case DType::kF16:
      convert(std::span<const Float16>(as<Float16>(data) + first, out.size()), out);
      break;
    case DType::kU8:
      throw InvalidArgument("widen: u8 holds raw bytes, not numbers");
  }
}

void narrow(std::span<const float> in, void* data, DType dtype, size_t first) {
  switch (dtype) {
    case DType::kF32:
      if (!in.empty()) std::memcpy(as<float>(data) + first, in.data(), in.size_bytes());
      break;
    case DType::kBF16:
      convert(in, std::span<BFloat16>(as<BFloat16>(data) + first, in.size()));
      break;
    case DType::kF16:
      convert(in, std::span<Float16>(as<Float16>(data) + first, in.size()));
      break;
    case DType::kU8:
      throw InvalidArgument("narrow: u8 holds raw bytes, not numbers");
  }
}

void accumulate(std::span<const float> in, void* data, DType dtype, size_t first) {
  if (dtype == DType::kF32) {
    float* d = as<float>(data) + first;
    for (size_t i = 0; i < in.size(); ++i) d[i] += in[i];
    return;
  }
  std::array<float, kChunk> tmp;
  for (size_t done = 0; done < in.size(); done += kChunk) {
    const size_t n = std::min(kChunk, in.size() - done);
    std::span<float> t(tmp.data(), n);
    widen(data, dtype, first + done, t);
    for (size_t i = 0; i < n; ++i) t[i] += in[done + i];
    narrow(t, data, dtype, first + done);
  }
}

// Reuses the optimizer's kernel chunk by chunk.
bool all_finite(const void* data, DType dtype, size_t first, size_t count) {
  bool ok = true;
  for_each_chunk(data, dtype, first, count,
                 [&](std::span<const float> c) { ok = ok && zerodp::all_finite(c); });
  return ok;
}

}  // namespace zerodp
