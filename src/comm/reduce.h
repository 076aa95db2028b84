// The one reduction every backend uses, so results are identical bits across backends.
//
// out[i] = ((in[0][i] op in[1][i]) op ...) op in[n-1][i], accumulated in fp32 in the order
// of `inputs` (rank order), then divided by n for kAvg, then rounded once to `dtype`
// (round to nearest even). kMax propagates NaN. The result of element i never depends on
// other elements, on buffer addresses or on how the range is split among calls, so a
// range may be reduced in pieces. `out` may alias one of the inputs exactly.
#pragma once

#include <cstddef>
#include <span>

#include "comm/communicator.h"

namespace zerodp {

//
// kSumInto: `out` is fp32 (whatever `dtype`, the inputs' type), and the fold starts from it:
// out[i] = ((out[i] + in[0][i]) + in[1][i]) + ...; nothing is divided or rounded. `out` must
// not alias an input.
//
// `divisor`: what kAvg divides by (0: the number of inputs). The second level of a two-level
// reduction folds P node partials but averages over the N ranks.
void reduce_rank_order(std::span<const void* const> inputs, void* out, size_t count, DType dtype,
                       ReduceOp op, int divisor = 0);

// acc[i] += x[i] widened to fp32, in element order (qgZ's exact own contribution).
void add_widened(ConstBuffer x, std::span<float> acc);
// The end of a quantized reduction (CommOptions::qgz_bits): `sum` holds the fp32 fold;
// kSumInto copies it into the fp32 accumulator `out`, kAvg divides by `world`, and kSum and
// kAvg round once to out's dtype.
void finish_sum(std::span<float> sum, MutableBuffer out, ReduceOp op, int world);

// The first level of a two-level reduction (CommOptions::two_level): how a node's T inputs
// are folded into its partial. Sums for kSum, kAvg and kSumInto (the average and the
// accumulator belong to the second level), max for kMax.
inline ReduceOp node_partial_op(ReduceOp op) {
  return op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
}

}  // namespace zerodp
