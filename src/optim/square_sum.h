// An exact sum of squares, so the gradient norm does not depend on how the elements are split
// over ranks or in what order the partial sums are merged.
//
// Exact: every x^2 of a float x is an integer multiple of 2^-298 (the square of the smallest
// subnormal), and SquareSum keeps Σ x^2 as that integer, with no rounding anywhere. Any split
// of the elements over any number of SquareSums, merged in any order, holds the same integer;
// value() rounds it once, to the nearest double (ties to even). So the norm is the same bits
// for every rank count, and is the correctly rounded Σ x^2, which a floating sum is not.
//
// Non-finite inputs: any NaN makes value() NaN; otherwise any Inf makes it +inf (as a
// floating sum would give). Merging keeps the worse of the two states.
//
// Exchange format (to_doubles / from_doubles), kExchangeDoubles doubles, each exact:
//   [0, kLimbs)  the integer Σ x^2 / 2^-298, little-endian, one 32-bit limb per double;
//   [kLimbs]     the non-finite state: 0 all finite, 1 an Inf seen, 2 a NaN seen.
// A control collective that carries doubles can therefore carry a SquareSum unchanged.
//
// Capacity: kLimbs * 32 = 640 bits. The largest square is below 2^256 = 2^554 units, so
// 2^86 elements fit; value() is at most about 2^342, never past the largest double.
//
// Cost: add() is one pass of integer operations, about 0.5 ns per element (16M fp32 values
// on one AMD EPYC core: 0.53 ns, against 0.21 ns for grad_clip.h's sum_of_squares), plus
// about 0.7 µs per call to fold its per-exponent bins into the limbs: call it on long ranges.
// merge() and value() are O(kLimbs).
//
// Thread safety: none; one SquareSum per thread, merged afterwards.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tensor/dtype.h"

namespace zerodp {

class SquareSum {
 public:
  static constexpr size_t kLimbs = 20;
  static constexpr size_t kExchangeDoubles = kLimbs + 1;

  // Adds x[i]^2 for every element.
  void add(std::span<const float> x);
  // Adds the squares of elements [first, first + count) of a buffer of `dtype`; the result
  // equals add() on the values widened to fp32. InvalidArgument for a null `data` with
  // count > 0 or an unknown dtype.
  void add(const void* data, DType dtype, size_t first, size_t count);

  // this += other, exactly.
  void merge(const SquareSum& other);

  // The exact total rounded to the nearest double, ties to even; 0 when nothing (or only
  // zeros) was added. Does not read the floating-point environment.
  double value() const;

  std::vector<double> to_doubles() const;
  // The inverse of to_doubles(). InvalidArgument if `d` does not hold kExchangeDoubles
  // values of the format above.
  static SquareSum from_doubles(std::span<const double> d);

  bool operator==(const SquareSum&) const = default;

 private:
  std::array<uint64_t, kLimbs> limbs_{};  // each below 2^32 between calls
  uint8_t nonfinite_ = 0;                 // the exchange format's state: 0, 1 or 2
};

}  // namespace zerodp
